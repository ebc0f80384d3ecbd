//! The OTLP/HTTP exporter: a batch of ended spans encoded by
//! [`Encoder`](crate::encode::Encoder) and POSTed as `http/protobuf` to
//! `<endpoint>/v1/traces`, on the export task (SPEC OBS-5).

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::encode::Encoder;
use crate::queue::Export;
use crate::span::Record;

/// Sends batches to one collector. Owned by the export task.
#[derive(Debug)]
pub(crate) struct OtlpHttp {
    client: reqwest::Client,
    url: String,
    encoder: Encoder,
}

impl OtlpHttp {
    /// An exporter of spans to `url` (the full `.../v1/traces`), encoded
    /// by `encoder`, each request with `headers` too.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub(crate) fn new(url: String, encoder: Encoder, headers: HeaderMap) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(OtlpHttp {
            client,
            url,
            encoder,
        })
    }

    /// Sends `spans` once (the export task bounds the time and counts a
    /// failure's spans dropped; a failed batch is not retried).
    ///
    /// # Errors
    /// The request failed or the collector did not answer 2xx.
    async fn send(&mut self, spans: &[Box<Record>]) -> Result<(), String> {
        let body = Bytes::from(self.encoder.request(spans));
        let kept = body.clone();
        let response = self
            .client
            .post(&self.url)
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        // Read the (small) answer so the connection can be reused.
        let _ = response.bytes().await;
        // The client has let go of the body once it is sent (else the
        // next batch gets a new one).
        if let Ok(body) = kept.try_into_mut() {
            self.encoder.reuse(Vec::from(body));
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered {status}"))
        }
    }
}

impl Export for OtlpHttp {
    fn export(&mut self, spans: &[Box<Record>]) -> impl Future<Output = Result<(), String>> + Send {
        self.send(spans)
    }
}

/// The headers of `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else of
/// `OTEL_EXPORTER_OTLP_HEADERS` (as `env` reads them), as the OpenTelemetry
/// exporter reads them: `key=value` pairs separated by commas, values
/// percent-decoded; a pair without a key or a value, or not a valid
/// header, is skipped.
pub(crate) fn env_headers(env: impl Fn(&str) -> Option<String>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let Some(text) =
        env("OTEL_EXPORTER_OTLP_TRACES_HEADERS").or_else(|| env("OTEL_EXPORTER_OTLP_HEADERS"))
    else {
        return headers;
    };
    for pair in text.split_terminator(',').map(str::trim) {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let value = percent_decode(value).unwrap_or_else(|| value.to_owned());
        if key.is_empty() || value.is_empty() {
            continue;
        }
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(k, v);
        }
    }
    headers
}

/// `%XX` escapes decoded; `None` if one is malformed or the result is not
/// UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::{OtlpHttp, env_headers};
    use crate::encode::Encoder;
    use crate::span::{Kind, Record};
    use crate::testing::Collector;

    // proves: OBS-5 (a batch's body goes back to the encoder once sent:
    // the next batch is written into the same memory, and both arrive)
    #[tokio::test]
    async fn a_sent_body_is_reused() {
        let collector = Collector::start().await;
        let encoder = Encoder::new("svc", "scope", "0.1.0", "https://example/schema");
        let url = format!("{}/v1/traces", collector.endpoint);
        let mut exporter = OtlpHttp::new(url, encoder, http::HeaderMap::new()).expect("client");
        let span = |i: u8| {
            let mut r = Box::new(Record::empty(64, 8));
            (r.trace_id, r.span_id, r.kind, r.operation) = ([i; 16], [i; 8], Kind::Client, "chat");
            r.set("tollgate.attempt", i64::from(i));
            r
        };
        exporter.send(&[span(1), span(2)]).await.expect("sent");
        let kept = exporter.encoder.body.capacity();
        assert!(kept > 0, "the first body was given back");
        exporter.send(&[span(3)]).await.expect("sent");
        assert_eq!(exporter.encoder.body.capacity(), kept, "and used again");
        assert_eq!(collector.spans().len(), 3);
    }

    // proves: OBS-5 (the standard OTLP header variables still reach the
    // collector now that the exporter is this crate's own: the traces
    // variable first, values percent-decoded, bad pairs skipped)
    #[test]
    fn headers_come_from_the_standard_variables() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let h = env_headers(env(&[(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "api-key=secret%20one, x-tenant = a=b ,novalue=,=nokey,bad name=x,plain",
        )]));
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["api-key"], "secret one");
        assert_eq!(h["x-tenant"], "a=b");
        let h = env_headers(env(&[
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=general"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "b=traces"),
        ]));
        assert_eq!(h.len(), 1);
        assert_eq!(h["b"], "traces");
        assert!(env_headers(env(&[])).is_empty());
    }
}
