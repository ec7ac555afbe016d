//! The `tracing` spans of requests and attempts, read back through a
//! subscriber of our own: one span per request with its time queued and
//! outcome, one child span per attempt.

mod common;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use callshaper::Error;
use callshaper::testing::{RetryAfter, Vendor};
use common::{SECOND, join_all, shaper};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

#[derive(Debug, Clone)]
struct Seen {
    name: &'static str,
    parent: Option<u64>,
    fields: BTreeMap<String, String>,
}

/// Keeps every span with its parent and fields, and every warning's
/// fields. Tests run on one thread (current-thread runtime), so one stack
/// of entered spans is enough to find a span's contextual parent.
#[derive(Default)]
struct Spans {
    next: AtomicU64,
    spans: Mutex<BTreeMap<u64, Seen>>,
    entered: Mutex<Vec<u64>>,
    warnings: Mutex<Vec<BTreeMap<String, String>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Spans {
    fn named(&self, name: &str) -> Vec<(u64, Seen)> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|(_, span)| span.name == name)
            .map(|(id, span)| (*id, span.clone()))
            .collect()
    }

    fn children(&self, parent: u64) -> Vec<Seen> {
        let spans = self.spans.lock().unwrap();
        spans
            .values()
            .filter(|span| span.parent == Some(parent))
            .cloned()
            .collect()
    }
}

impl Subscriber for Spans {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let parent = match attributes.parent() {
            Some(parent) => Some(parent.into_u64()),
            None if attributes.is_contextual() => self.entered.lock().unwrap().last().copied(),
            None => None,
        };
        let mut fields = BTreeMap::new();
        attributes.record(&mut Fields(&mut fields));
        let name = attributes.metadata().name();
        let seen = Seen {
            name,
            parent,
            fields,
        };
        self.spans.lock().unwrap().insert(id, seen);
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some(seen) = self.spans.lock().unwrap().get_mut(&span.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            self.warnings.lock().unwrap().push(fields);
        }
    }

    fn enter(&self, span: &Id) {
        self.entered.lock().unwrap().push(span.into_u64());
    }

    fn exit(&self, span: &Id) {
        let mut entered = self.entered.lock().unwrap();
        if let Some(at) = entered.iter().rposition(|id| *id == span.into_u64()) {
            entered.remove(at);
        }
    }
}

/// Three requests at 10/s; the vendor throttles the first for a second.
/// Each request has one span with its lane, method and URL (no query),
/// and one child per attempt with its status; the throttled one went
/// twice, and its wait in the lane (the pause) is on its span.
#[tokio::test(start_paused = true)]
async fn each_request_has_a_span_and_each_attempt_a_child() {
    let spans = Arc::new(Spans::default());
    let _subscribed = tracing::subscriber::set_default(spans.clone());
    let vendor = Vendor::strict(10, SECOND).start().await;
    vendor.throttle_for(Duration::from_millis(10), RetryAfter::Seconds(1));
    let shaper = shaper(10).build().unwrap();

    let tasks = (0..3)
        .map(|i| {
            let url = format!("{}/r/{i}?api_key=secret", vendor.uri());
            tokio::spawn(shaper.get(url).send())
        })
        .collect();
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }

    let requests = spans.named("callshaper.request");
    assert_eq!(requests.len(), 3);
    let mut attempts_seen = 0;
    for (id, request) in &requests {
        let fields = &request.fields;
        assert_eq!(fields["method"], "GET");
        assert!(fields["url"].starts_with(&vendor.uri()), "{fields:?}");
        assert!(!fields["url"].contains("secret"), "{fields:?}");
        assert_eq!(fields["lane"], vendor.uri());
        assert_eq!(fields["vendor"], vendor.uri());
        assert_eq!(fields["level"], "vendor");
        assert_eq!(fields["cost"], "1");
        assert_eq!(fields["priority"], "interactive");
        assert_eq!(fields["outcome"], "response");
        let attempts: usize = fields["attempts"].parse().unwrap();
        let children = spans.children(*id);
        assert_eq!(children.len(), attempts, "{children:?}");
        assert!(children.iter().all(|c| c.name == "callshaper.attempt"));
        let statuses: Vec<_> = children
            .iter()
            .map(|c| c.fields["status"].as_str())
            .collect();
        if fields["throttles"] == "1" {
            assert_eq!(statuses, ["429", "200"]);
            let queued: u64 = fields["queued_ms"].parse().unwrap();
            assert!(queued >= 1_000, "waited out the pause: {queued} ms");
        } else {
            assert_eq!(fields["throttles"], "0");
            assert_eq!(statuses, ["200"]);
        }
        attempts_seen += attempts;
    }
    assert_eq!(attempts_seen, 4, "three requests, one throttled once");
    assert_eq!(vendor.arrivals().len(), 4);
}

/// A request the shaper ends says why, and never went on the wire.
#[tokio::test(start_paused = true)]
async fn a_refused_request_records_its_reason_and_no_attempt() {
    let spans = Arc::new(Spans::default());
    let _subscribed = tracing::subscriber::set_default(spans.clone());
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(1).build().unwrap();
    assert_eq!(shaper.get(vendor.uri()).send().await.unwrap().status(), 200);
    let refused = shaper
        .get(vendor.uri())
        .max_wait(Duration::from_millis(100))
        .send()
        .await;
    assert!(matches!(refused, Err(Error::WouldExceedMaxWait { .. })));

    let requests = spans.named("callshaper.request");
    assert_eq!(requests.len(), 2);
    let (id, last) = &requests[1];
    assert_eq!(last.fields["outcome"], "would_exceed_max_wait");
    assert_eq!(last.fields["attempts"], "0");
    assert!(spans.children(*id).is_empty());
}

/// A client given to the shaper that follows redirects by itself sends
/// its hops without a turn, and reqwest does not say how many: the shaper
/// says so, once, naming the lane and both paths (never the query). The
/// shaper's own client follows none, and says nothing.
#[tokio::test(start_paused = true)]
async fn a_client_that_follows_redirects_by_itself_is_named_once() {
    use wiremock::matchers::path;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let spans = Arc::new(Spans::default());
    let _subscribed = tracing::subscriber::set_default(spans.clone());
    let server = MockServer::start().await;
    Mock::given(path("/old"))
        .respond_with(ResponseTemplate::new(301).insert_header("location", "/new"))
        .mount(&server)
        .await;
    Mock::given(path("/new"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let url = format!("{}/old?key=secret", server.uri());

    let own = callshaper::Shaper::builder()
        .rate(100, SECOND)
        .build()
        .unwrap();
    let answer = own.get(&url).send().await.unwrap();
    assert_eq!(answer.url().path(), "/new", "the shaper followed it");
    assert!(spans.warnings.lock().unwrap().is_empty());

    let given = callshaper::Shaper::builder()
        .rate(100, SECOND)
        .client(reqwest::Client::new())
        .build()
        .unwrap();
    for _ in 0..3 {
        let answer = given.get(&url).send().await.unwrap();
        assert_eq!(answer.status(), 200);
    }
    let warnings = spans.warnings.lock().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let warning = &warnings[0];
    assert_eq!(warning["sent"], format!("{}/old", server.uri()));
    assert_eq!(warning["landed"], format!("{}/new", server.uri()));
    assert!(warning["lane"].contains("127.0.0.1"), "{warning:?}");
    assert!(warning["message"].contains("Policy::none()"), "{warning:?}");
    assert!(!format!("{warning:?}").contains("secret"));
}
