//! `Retry-After` for the loader's own retries. object_store's retry error keeps a failed
//! response's status and body but not its headers, so this HTTP connector (object_store's reqwest
//! client underneath) puts the header's delay in front of the body of a 429 or 503 answer, where
//! [`retry_after`] finds it in the error text. Only the delay-seconds form is read; an HTTP-date is
//! left alone (the loader's own backoff applies).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};

/// What precedes the delay in a rewritten error body.
const MARKER: &str = "retry-after-seconds=";
/// Bytes of an error body kept (it is only ever shown in an error message).
pub const ERROR_BODY_KEEP_BYTES: usize = 4096;
/// The longest delay read from a `Retry-After` header; a longer one is read as this (and then
/// ends the retries: it passes every retry time budget).
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(3600);

/// object_store's reqwest connector, with `Retry-After` carried into the error body.
#[derive(Debug, Default)]
pub(crate) struct RetryAfterConnector;

impl HttpConnector for RetryAfterConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(RetryAfterService { inner }))
    }
}

#[derive(Debug)]
struct RetryAfterService {
    inner: HttpClient,
}

type Answer<'a> = Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'a>>;

impl HttpService for RetryAfterService {
    fn call<'s, 'a>(&'s self, request: HttpRequest) -> Answer<'a>
    where
        's: 'a,
        Self: 'a,
    {
        Box::pin(async move {
            let response = self.inner.execute(request).await?;
            let status = response.status().as_u16();
            let delay = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let Some(seconds) = delay.filter(|_| status == 429 || status == 503) else {
                return Ok(response);
            };
            let (parts, body) = response.into_parts();
            let mut kept = Vec::new();
            let mut stream = body.bytes_stream();
            while kept.len() < ERROR_BODY_KEEP_BYTES {
                match stream.next().await {
                    Some(Ok(chunk)) => {
                        let take = chunk.len().min(ERROR_BODY_KEEP_BYTES - kept.len());
                        kept.extend_from_slice(&chunk[..take]);
                    }
                    Some(Err(_)) | None => break,
                }
            }
            let text = format!("{MARKER}{seconds} {}", String::from_utf8_lossy(&kept));
            Ok(HttpResponse::from_parts(parts, text.into()))
        })
    }
}

/// The delay a server asked for, found in an error's text (see the module documentation).
pub(crate) fn retry_after(error_text: &str) -> Option<Duration> {
    let at = error_text.find(MARKER)? + MARKER.len();
    let digits: String = error_text[at..].chars().take_while(char::is_ascii_digit).collect();
    let seconds = digits.parse::<u64>().unwrap_or(u64::MAX);
    Some(Duration::from_secs(seconds).min(RETRY_AFTER_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_is_read_back_from_the_error_text() {
        let text =
            "Generic HTTP error: Server returned non-2xx status code: 429: retry-after-seconds=7 slow down";
        assert_eq!(retry_after(text), Some(Duration::from_secs(7)));
        assert_eq!(retry_after("503: no marker"), None);
        assert_eq!(retry_after("retry-after-seconds=99999999999999999999999"), Some(RETRY_AFTER_MAX));
    }
}
