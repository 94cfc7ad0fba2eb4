use tower::Layer;

use super::{Admission, AdmissionService};

/// Applies [`AdmissionService`] to a server's service. Build with
/// [`Agent::admission_layer`](crate::Agent::admission_layer) or [`Admission::layer`].
///
/// With axum, add it with `Router::layer` (so the matched route template is known); with
/// tonic, with `Server::builder().layer(…)`.
#[derive(Clone, Debug)]
pub struct AdmissionLayer {
    admission: Admission,
}

impl AdmissionLayer {
    /// A layer admitting through `admission`.
    pub fn new(admission: Admission) -> Self {
        Self { admission }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = AdmissionService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService::new(inner, self.admission.clone())
    }
}
