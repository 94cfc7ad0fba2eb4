use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{Either, Full};

use super::{Reason, Rejected};

/// The response body of a service behind the admission layer: the inner service's body,
/// or the short body of a rejection.
pub type AdmissionBody<B> = Either<B, Full<Bytes>>;

macro_rules! problem {
    ($detail:literal) => {
        concat!(
            r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":""#,
            $detail,
            r#""}"#
        )
    };
}

/// The problem+json (RFC 9457) body of a rejection: static text, nothing from the request.
fn body(reason: Reason) -> &'static str {
    match reason {
        Reason::Limit => {
            problem!("The service is at its concurrency limit; the request was shed. Retry later.")
        }
        Reason::QueueFull => {
            problem!("The service is overloaded and its queue is full; the request was shed. Retry later.")
        }
        Reason::Displaced => problem!(
            "The service is overloaded; the request gave its queue place to a more critical one. Retry later."
        ),
        Reason::QueueTimeout => {
            problem!("The service is overloaded; the request waited too long in its queue. Retry later.")
        }
        Reason::Deadline => problem!(
            "The request's remaining deadline is shorter than the time the service needs; it was not started."
        ),
        Reason::Operator => {
            problem!("The service is shedding low-criticality traffic on operator request. Retry later.")
        }
        Reason::ReadOnly => problem!(
            "The service is in read-only mode: this route changes data and is unavailable until read-only mode ends."
        ),
        Reason::Flushed => problem!(
            "The service's queue was flushed by an operator; the request was not started. Retry later."
        ),
    }
}

/// `grpc-message` values: percent-encoded static text.
fn grpc_message(reason: Reason) -> &'static str {
    match reason {
        Reason::ReadOnly => "read-only%20mode:%20this%20method%20changes%20data",
        Reason::Deadline => "deadline%20shorter%20than%20the%20expected%20service%20time",
        _ => "overloaded:%20request%20shed",
    }
}

fn header(v: &'static str) -> HeaderValue {
    HeaderValue::from_static(v)
}

/// The answer to a rejected request: HTTP 503 with `Retry-After` and a problem+json body,
/// or for gRPC a Trailers-Only answer (HTTP 200, `grpc-status` RESOURCE_EXHAUSTED or
/// UNAVAILABLE, `grpc-retry-pushback-ms`).
pub(crate) fn rejection<B>(r: &Rejected, grpc: bool) -> Response<AdmissionBody<B>> {
    let retry_after = r.retry_after();
    if grpc {
        let mut res = Response::new(Either::Right(Full::new(Bytes::new())));
        let h = res.headers_mut();
        h.insert(CONTENT_TYPE, header("application/grpc"));
        h.insert("grpc-status", HeaderValue::from(r.grpc_code() as i32));
        h.insert("grpc-message", header(grpc_message(r.reason())));
        h.insert("grpc-retry-pushback-ms", HeaderValue::from(retry_after.as_millis() as u64));
        return res;
    }
    let mut res = Response::new(Either::Right(Full::new(Bytes::from_static(body(r.reason()).as_bytes()))));
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, header("application/problem+json"));
    h.insert(RETRY_AFTER, HeaderValue::from(retry_after.as_secs()));
    res
}
