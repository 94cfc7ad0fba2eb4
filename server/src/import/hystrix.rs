//! stub
use super::ImportError;
use super::report::Report;
use crate::manifest::ServiceManifest;

pub fn import(
    _file: &str,
    _text: &str,
    _base: ServiceManifest,
) -> Result<(ServiceManifest, Report), ImportError> {
    Err(ImportError::Shape("not yet".into()))
}
