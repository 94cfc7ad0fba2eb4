//! The service under test: a real HTTP server on 127.0.0.1 (port 0) whose capacity is
//! known, behind one of the protections compared.
//!
//! Capacity comes from a **handler pool** of fixed size doing fixed work, like the thread
//! pool of a classic server: a request takes a worker (waiting in the pool's FIFO queue
//! when all are busy) and holds it for the work time (a timer, so the capacity does not
//! depend on how busy the 2 shared cores are). Work that started is finished even when the
//! client has gone, as a thread pool would: capacity = workers / work.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::{get, post};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use levee_agent::admission::Admission;
use levee_agent::policy::Inbound;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// A fixed pool of workers doing fixed work.
#[derive(Clone, Debug)]
pub struct Pool {
    workers: Arc<ArcSwap<Semaphore>>,
    size: usize,
}

impl Pool {
    pub fn new(size: usize) -> Self {
        Self { workers: Arc::new(ArcSwap::from_pointee(Semaphore::new(size))), size }
    }

    /// Ends the work waiting for a worker (the run is over).
    pub fn close(&self) {
        self.workers.load().close();
    }

    /// Abandons the work still waiting for a worker (whose clients gave up long ago) and
    /// starts again with an idle pool: between load steps, so a step's backlog does not
    /// spill into the next one. Work running now finishes on its old worker.
    pub fn reset(&self) {
        let old = self.workers.swap(Arc::new(Semaphore::new(self.size)));
        old.close();
    }

    /// Waits for a worker and holds it for `work`; the work runs to its end even when the
    /// caller stops waiting for it.
    pub async fn run(&self, work: Duration) {
        // The timer starts when the worker is taken (`sleep` would start it now).
        self.run_with(async move { tokio::time::sleep(work).await }).await;
    }

    /// Waits for a worker and holds it while `job` runs (a handler of a thread-per-request
    /// server: the worker stays busy while it waits for a dependency). The job runs to its
    /// end even when the caller stops waiting; `None` when the pool closed first.
    pub async fn run_with<F>(&self, job: F) -> Option<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let workers = self.workers.load_full();
        let job = tokio::spawn(async move {
            let _worker = workers.acquire_owned().await.ok()?;
            Some(job.await)
        });
        job.await.ok().flatten()
    }
}

/// What stands between the clients and the handlers.
#[derive(Clone, Debug)]
pub enum Protection {
    /// Nothing: every request waits for a worker.
    None,
    /// tower's `LoadShed` over `ConcurrencyLimit(limit)` (a fixed limit, refused at once
    /// when reached).
    TowerFixed { limit: usize },
    /// `tower-acc` as its README's load-shedding example stacks it: `LoadShed` over
    /// `Buffer(16)` over its adaptive `ConcurrencyLimitLayer`, algorithm defaults.
    AccGradient2,
    /// As [`Protection::AccGradient2`] with Vegas.
    AccVegas,
    /// Levee's admission layer enforcing this policy.
    Levee(Box<Inbound>),
}

/// The buffer of the tower-acc stacks (its README's hyper example).
const ACC_BUFFER: usize = 16;

pub type HttpService = BoxCloneSyncService<Request<Incoming>, Response<Body>, Infallible>;

/// Wraps `router` (the handlers) in `protection`; an error of a tower stack (load shed)
/// becomes a 503, as the peers' examples answer it.
pub fn protect(router: Router, protection: &Protection) -> HttpService {
    match protection {
        Protection::None => {
            BoxCloneSyncService::new(router.map_request(|r: Request<Incoming>| r.map(Body::new)))
        }
        Protection::Levee(inbound) => {
            let admission = Admission::with_seed(inbound, 7);
            let router = router.layer(admission.layer());
            BoxCloneSyncService::new(router.map_request(|r: Request<Incoming>| r.map(Body::new)))
        }
        Protection::TowerFixed { limit } => {
            let svc = ServiceBuilder::new()
                .map_request(|r: Request<Incoming>| r.map(Body::new))
                .load_shed()
                .concurrency_limit(*limit)
                .service(router);
            shed_as_503(svc)
        }
        Protection::AccGradient2 => {
            let svc = ServiceBuilder::new()
                .map_request(|r: Request<Incoming>| r.map(Body::new))
                .load_shed()
                .buffer(ACC_BUFFER)
                .layer(tower_acc::ConcurrencyLimitLayer::new(tower_acc::Gradient2::default()))
                .service(router);
            shed_as_503(svc)
        }
        Protection::AccVegas => {
            let svc = ServiceBuilder::new()
                .map_request(|r: Request<Incoming>| r.map(Body::new))
                .load_shed()
                .buffer(ACC_BUFFER)
                .layer(tower_acc::ConcurrencyLimitLayer::new(tower_acc::Vegas::default()))
                .service(router);
            shed_as_503(svc)
        }
    }
}

fn shed_as_503<S, E>(svc: S) -> HttpService
where
    S: tower::Service<Request<Incoming>, Response = Response<Body>, Error = E>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    E: Into<BoxError>,
{
    // poll_ready errors (LoadShed: overloaded) come out of `oneshot` too.
    BoxCloneSyncService::new(tower::service_fn(move |req: Request<Incoming>| {
        let svc = svc.clone();
        async move {
            Ok::<_, Infallible>(match svc.oneshot(req).await {
                Ok(r) => r,
                Err(e) => {
                    let e: BoxError = e.into();
                    let status = if e.is::<tower::load_shed::error::Overloaded>() {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    };
                    Response::builder()
                        .status(status)
                        .body(Body::from(e.to_string()))
                        .expect("valid response")
                }
            })
        }
    }))
}

/// The handlers of the overload steps: `GET /work` and `POST /checkout` take a worker for
/// `work`.
pub fn work_router(pool: Pool, work: Duration) -> Router {
    let handler = |State((pool, work)): State<(Pool, Duration)>| async move {
        pool.run(work).await;
        "done"
    };
    Router::new()
        .route("/work", get(handler))
        .route("/checkout", post(handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/noop", post(|| async { "ok" }))
        .with_state((pool, work))
}

/// A server on 127.0.0.1 (port 0) serving `svc` over HTTP/1.1 and HTTP/2; stops when
/// dropped.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl Server {
    pub async fn start(svc: HttpService) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let accept = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let _ = stream.set_nodelay(true);
                let svc = svc.clone();
                conns.spawn(async move {
                    let hyper_svc = hyper_util::service::TowerToHyperService::new(svc);
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), hyper_svc)
                        .await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Self { addr, accept })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection.
        self.accept.abort();
    }
}
