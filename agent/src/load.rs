//! A live load signal on real GPUs: how many requests each tenant's serving stack received, so that the coordinator
//! forecasts from real rates. Two ways in, both cumulative counters the agent turns into `arrivals` in its heartbeat
//! (the coordinator computes rates from their increase between heartbeats):
//!
//! - **scraping**: the agent reads a Prometheus text endpoint of the serving stack every `interval`
//!   (`[load]` in the agent's config) and sums the samples of a counter, optionally only those with given labels:
//!   Triton's `nv_inference_request_success{model="resnet50"}`, vLLM's `vllm:request_success_total{model_name=...}`,
//!   or any other name;
//! - **reporting**: a serving stack calls the agent's `ReportLoad` with its counters.
//!
//! Each source (an endpoint, or a reporter's `source` name) is followed separately: the first value seen is its
//! baseline, an increase counts, and a decrease means the source restarted, after which its new value counts whole.
//! A source that cannot be read counts nothing until it can.
//!
//! The exposition parser is this module's own: the `prometheus-parse` crate's names are `\w+`, which refuses the `:`
//! of vLLM's metric names (allowed by the format). It reads sample lines as the text format defines them (name,
//! optional `{label="value",...}` with `\\`, `\"` and `\n` escapes, value, optional timestamp) and skips comments.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tessera_core::ids::TenantId;

/// Longest `/metrics` answer read (a serving stack's exposition is kilobytes).
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// One endpoint to scrape for one tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeSource {
    /// The tenant whose requests it counts.
    pub tenant: TenantId,
    /// `http://HOST:PORT/PATH`.
    pub url: String,
    /// The counter's sample name.
    pub metric: String,
    /// Only samples with these labels (all of them) count.
    pub labels: BTreeMap<String, String>,
}

/// Where the agent reads load from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// How often each endpoint is read.
    pub interval: Duration,
    /// The endpoints.
    pub sources: Vec<ScrapeSource>,
}

#[derive(Debug, Default)]
struct Followed {
    last: Option<f64>,
    counted: f64,
}

/// The cumulative requests of each tenant, from every source.
#[derive(Debug, Default)]
pub struct LoadSignal {
    sources: Mutex<BTreeMap<(TenantId, String), Followed>>,
}

impl LoadSignal {
    /// Takes `value`, the current reading of `source`'s counter for `tenant` (see the module doc).
    pub fn observe(&self, tenant: &TenantId, source: &str, value: f64) {
        if !value.is_finite() || value < 0.0 {
            return;
        }
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        let f = sources.entry((tenant.clone(), source.to_string())).or_default();
        match f.last {
            None => {}
            Some(last) if value >= last => f.counted += value - last,
            Some(_) => f.counted += value,
        }
        f.last = Some(value);
    }

    /// How many sources have been read at least once.
    pub fn sources(&self) -> usize {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Requests counted per tenant since the agent started, over every source.
    pub fn arrivals(&self) -> BTreeMap<TenantId, u64> {
        let sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: BTreeMap<TenantId, f64> = BTreeMap::new();
        for ((tenant, _), f) in sources.iter() {
            *out.entry(tenant.clone()).or_insert(0.0) += f.counted;
        }
        out.into_iter().map(|(t, n)| (t, n.round() as u64)).collect()
    }
}

/// One sample line: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// Parses one line of the Prometheus text format; `None` for comments, blank lines and lines that are not samples.
pub fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        loop {
            while chars.next_if(|(_, c)| *c == ' ' || *c == ',').is_some() {}
            match chars.peek() {
                Some((i, '}')) => {
                    rest = &inner[i + 1..];
                    break;
                }
                None => return None,
                _ => {}
            }
            let mut key = String::new();
            while let Some((_, c)) = chars.next_if(|(_, c)| c.is_ascii_alphanumeric() || *c == '_') {
                key.push(c);
            }
            while chars.next_if(|(_, c)| *c == ' ').is_some() {}
            if key.is_empty() || chars.next().map(|(_, c)| c) != Some('=') {
                return None;
            }
            while chars.next_if(|(_, c)| *c == ' ').is_some() {}
            if chars.next().map(|(_, c)| c) != Some('"') {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    c => value.push(c),
                }
            }
            labels.insert(key, value);
        }
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name: name.to_string(), labels, value })
}

/// Why a counter could not be read from an exposition.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CounterError {
    /// A matching sample that is not a count.
    #[error("line {line}: `{metric}` is {value}, not a request count")]
    NotACount {
        /// The sample's line, from 1.
        line: usize,
        /// The metric.
        metric: String,
        /// Its value.
        value: f64,
    },
    /// No sample matched.
    #[error("no sample of `{metric}` with labels {labels:?}")]
    Missing {
        /// The metric.
        metric: String,
        /// The labels asked for.
        labels: BTreeMap<String, String>,
    },
    /// The samples sum past a finite number.
    #[error("the samples of `{0}` sum beyond the range of a count")]
    Overflow(String),
}

/// A load source that could not be read; each names the URL.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL does not parse.
    #[error("{url}: {source}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        source: hyper::http::uri::InvalidUri,
    },
    /// The request failed.
    #[error("{url}: {source}")]
    Request {
        /// The URL.
        url: String,
        /// Why.
        source: hyper_util::client::legacy::Error,
    },
    /// The answer was not a success.
    #[error("{url}: HTTP {status}")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: hyper::StatusCode,
    },
    /// The body could not be read within [`MAX_BODY_BYTES`].
    #[error("{url}: {message}")]
    Body {
        /// The URL.
        url: String,
        /// Why.
        message: String,
    },
    /// The body is not UTF-8.
    #[error("{url}: the answer is not UTF-8")]
    NotUtf8 {
        /// The URL.
        url: String,
    },
    /// No answer in time.
    #[error("{url}: no answer within {timeout:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The time allowed.
        timeout: Duration,
    },
    /// The counter could not be read from the answer.
    #[error("{url}: {source}")]
    Counter {
        /// The URL.
        url: String,
        /// Why.
        source: CounterError,
    },
}

/// The sum of `metric`'s samples in `text` whose labels include `labels`. An error says that no sample matched, or
/// names the first matching sample whose value is not a count (negative, NaN or infinite: a request counter is a
/// finite number at least 0, and one such sample would make the sum meaningless).
pub fn counter_value(text: &str, metric: &str, labels: &BTreeMap<String, String>) -> Result<f64, CounterError> {
    let mut found = false;
    let mut sum = 0.0;
    for (n, line) in text.lines().enumerate() {
        let Some(s) = parse_sample(line) else { continue };
        if s.name == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)) {
            if !s.value.is_finite() || s.value < 0.0 {
                return Err(CounterError::NotACount { line: n + 1, metric: metric.to_string(), value: s.value });
            }
            found = true;
            sum += s.value;
        }
    }
    match (found, sum.is_finite()) {
        (false, _) => Err(CounterError::Missing { metric: metric.to_string(), labels: labels.clone() }),
        (true, false) => Err(CounterError::Overflow(metric.to_string())),
        (true, true) => Ok(sum),
    }
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Empty<bytes::Bytes>,
>;

fn http_client() -> HttpClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// `GET url` (plain HTTP), its body as text: an error names the URL and what failed.
pub async fn fetch(url: &str, timeout: Duration) -> Result<String, FetchError> {
    fetch_with(&http_client(), url, timeout).await
}

/// [`fetch`] through `client`, whose connections are kept between calls.
async fn fetch_with(client: &HttpClient, url: &str, timeout: Duration) -> Result<String, FetchError> {
    use http_body_util::BodyExt as _;
    let url_ = || url.to_string();
    let uri: hyper::Uri = url.parse().map_err(|source| FetchError::Url { url: url_(), source })?;
    let call = async {
        let resp = client.get(uri).await.map_err(|source| FetchError::Request { url: url_(), source })?;
        if !resp.status().is_success() {
            return Err(FetchError::Status { url: url_(), status: resp.status() });
        }
        let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| FetchError::Body { url: url_(), message: e.to_string() })?
            .to_bytes();
        String::from_utf8(body.to_vec()).map_err(|_| FetchError::NotUtf8 { url: url_() })
    };
    tokio::time::timeout(timeout, call).await.map_err(|_| FetchError::Timeout { url: url_(), timeout })?
}

/// Reads every source every `options.interval` into `signal` until `shutdown` turns true. A failing source is
/// logged when it starts failing and when it recovers.
pub async fn scrape_loop(
    options: LoadOptions,
    signal: std::sync::Arc<LoadSignal>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut failing = vec![false; options.sources.len()];
    let timeout = options.interval.min(Duration::from_secs(5));
    let client = http_client();
    loop {
        for (i, s) in options.sources.iter().enumerate() {
            let read = fetch_with(&client, &s.url, timeout).await.and_then(|text| {
                counter_value(&text, &s.metric, &s.labels)
                    .map_err(|source| FetchError::Counter { url: s.url.clone(), source })
            });
            match read {
                Ok(v) => {
                    if failing[i] {
                        tracing::info!(tenant = %s.tenant, url = %s.url, "load source readable again");
                    }
                    failing[i] = false;
                    signal.observe(&s.tenant, &format!("scrape:{i}:{}", s.url), v);
                }
                Err(e) => {
                    if !failing[i] {
                        tracing::warn!(tenant = %s.tenant, "load source: {e}");
                    }
                    failing[i] = true;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(options.interval) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TenantId {
        TenantId::new(s).unwrap()
    }

    #[test]
    fn samples_parse_as_the_text_format_defines_them() {
        let s =
            parse_sample(r#"nv_inference_request_success{model="resnet50",version="1"} 1027 1700000000000"#).unwrap();
        assert_eq!(
            (s.name.as_str(), s.value, s.labels["model"].as_str()),
            ("nv_inference_request_success", 1027.0, "resnet50")
        );
        let s = parse_sample(r#"vllm:request_success_total{finished_reason="stop",model_name="a \"b\", c\\d\n"} 5.0"#)
            .unwrap();
        assert_eq!(s.name, "vllm:request_success_total");
        assert_eq!(s.labels["model_name"], "a \"b\", c\\d\n");
        assert_eq!(parse_sample("plain_total 3").unwrap().value, 3.0);
        assert_eq!(parse_sample("x{} +Inf").unwrap().value, f64::INFINITY);
        for bad in ["# HELP x y", "", "   ", "x{a=\"1\" 2", "x{a=1} 2", "1x 2", "x notanumber", "x{a=\"1\"}"] {
            assert_eq!(parse_sample(bad), None, "{bad}");
        }
    }

    #[test]
    fn counters_sum_the_matching_series() {
        let text = "# TYPE nv_inference_request_success counter\n\
                    nv_inference_request_success{model=\"resnet50\",version=\"1\"} 100\n\
                    nv_inference_request_success{model=\"resnet50\",version=\"2\"} 20\n\
                    nv_inference_request_success{model=\"bert\",version=\"1\"} 7\n";
        let only = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(counter_value(text, "nv_inference_request_success", &only("model", "resnet50")), Ok(120.0));
        assert_eq!(counter_value(text, "nv_inference_request_success", &BTreeMap::new()), Ok(127.0));
        assert!(counter_value(text, "nv_inference_request_success", &only("model", "gpt")).is_err());
        assert!(
            counter_value(text, "other", &BTreeMap::new()).unwrap_err().to_string().contains("no sample of `other`")
        );
        // Values that are not counts are refused, naming the line; found by the `load_exposition` fuzzer, where
        // `+Inf` and `-Inf` summed to NaN.
        for bad in ["x{} +Inf\nx{} -Inf\n", "x 3\nx -1\n", "x NaN\n"] {
            let e = counter_value(bad, "x", &BTreeMap::new()).unwrap_err().to_string();
            assert!(e.starts_with("line ") && e.contains("not a request count"), "{bad:?}: {e}");
        }
        let e = counter_value("x 1e308\nx 1e308\n", "x", &BTreeMap::new()).unwrap_err();
        assert_eq!(e, CounterError::Overflow("x".into()));
    }

    #[test]
    fn sources_count_increases_from_their_first_reading_and_survive_restarts() {
        let s = LoadSignal::default();
        s.observe(&t("a"), "x", 1000.0); // baseline: what happened before the agent looked is not counted
        s.observe(&t("a"), "x", 1030.0);
        s.observe(&t("a"), "y", 5.0);
        s.observe(&t("a"), "y", 9.0);
        assert_eq!(s.arrivals()[&t("a")], 34);
        s.observe(&t("a"), "x", 12.0); // x restarted: its 12 new requests count
        s.observe(&t("a"), "x", f64::NAN);
        s.observe(&t("a"), "x", -1.0);
        assert_eq!(s.arrivals()[&t("a")], 46);
        s.observe(&t("b"), "x", 3.0);
        assert_eq!(s.arrivals()[&t("b")], 0);
    }
}
