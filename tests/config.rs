//! A shaper declared in a file: the shipped `examples/vendors.toml` runs
//! against embedded vendors, and a malformed file names its field.

mod common;

use std::time::Duration;

use callshaper::config::ShaperConfig;
use callshaper::lane::Adaptive;
use callshaper::retry::{Backoff, RetryPolicy};
use callshaper::testing::{HoldClock, Vendor};
use callshaper::{Error, Quota};
use common::{SECOND, join_all};

const VENDORS: &str = include_str!("../examples/vendors.toml");

fn host_of(vendor: &Vendor) -> String {
    vendor.uri().trim_start_matches("http://").to_owned()
}

#[tokio::test(start_paused = true)]
async fn the_shipped_config_holds_every_vendors_quotas() {
    let minute = Duration::from_secs(60);
    let llm = Vendor::strict(500, minute)
        .also_cost(90_000, minute, "x-tokens")
        .start()
        .await;
    let payments = Vendor::strict(100, SECOND).start().await;
    let sms = Vendor::strict(10, SECOND).start().await;
    let mut config = ShaperConfig::from_toml(VENDORS).unwrap();
    for (name, vendor) in [("llm", &llm), ("payments", &payments), ("sms", &sms)] {
        config.vendors.get_mut(name).unwrap().host = Some(host_of(vendor));
    }
    let shaper = config
        .builder()
        .unwrap()
        .transport(HoldClock(reqwest::Client::new()))
        .build()
        .unwrap();

    let mut tasks = Vec::new();
    for i in 0..30 {
        let call = shaper
            .get(format!("{}/send/{i}", sms.uri()))
            .header("x-api-key", "k1")
            .send();
        tasks.push(tokio::spawn(call));
    }
    for i in 0..12 {
        tasks.push(tokio::spawn(
            shaper
                .post(format!("{}/v1/payments", payments.uri()))
                .body(format!("{i}"))
                .send(),
        ));
    }
    for i in 0..4 {
        let call = shaper
            .post(format!("{}/v1/chat/{i}", llm.uri()))
            .header("x-tokens", "30000")
            .cost(30_000)
            .tag(format!("customer-{i}"))
            .send();
        tasks.push(tokio::spawn(call));
    }
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }

    for vendor in [&llm, &payments, &sms] {
        assert_eq!(vendor.throttled(), 0);
    }
    assert!(sms.max_in_any_window(SECOND) <= 10);
    let paid: Vec<_> = payments.arrivals().iter().map(|a| a.at).collect();
    assert!(
        paid[..10].iter().all(|&at| at < SECOND),
        "ten payments in the first window"
    );
    assert!(
        paid[10..].iter().all(|&at| at >= minute),
        "the rest in the next: {paid:?}"
    );
    let chats: Vec<_> = llm.arrivals().iter().map(|a| a.at).collect();
    assert!(
        chats[..3].iter().all(|&at| at < SECOND),
        "90,000 tokens: three at once"
    );
    assert!(chats[3] >= minute, "the fourth waits for tokens: {chats:?}");
    assert!(llm.max_cost_in_any_window(minute) <= 90_000);

    // Refused, and named without what may carry a key.
    let elsewhere = shaper
        .get("http://user:token@127.0.0.1:1/unknown?key=AIza#top")
        .send()
        .await;
    match elsewhere {
        Err(Error::NoQuota { url }) => assert_eq!(url, "http://127.0.0.1:1/unknown"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_same_config_reads_from_json() {
    let json = r#"{
        "defaults": { "max_wait": "30s" },
        "vendors": { "sms": { "host": "api.sms.example", "quotas": [
            { "algorithm": "leaky_bucket", "count": 10, "per": "1s" }
        ] } }
    }"#;
    let config = ShaperConfig::from_json(json).unwrap();
    assert_eq!(config.vendors["sms"].quotas[0].rate().count, 10);
    config.build().unwrap();
}

#[test]
fn a_malformed_config_names_the_field_and_the_problem() {
    let with = |from: &str, to: &str| {
        assert!(VENDORS.contains(from), "{from}");
        ShaperConfig::from_toml(&VENDORS.replacen(from, to, 1)).and_then(|c| c.build().map(|_| c))
    };
    let cases = [
        (
            with(
                r#"count = 90000, per = "1m""#,
                r#"count = 90000, per = "soon""#,
            ),
            "vendors.llm.quotas[1].per",
            "not a duration",
        ),
        (
            with("headroom =", "headrom ="),
            "defaults.headrom",
            "unknown field `headrom`",
        ),
        (
            with(
                "algorithm = \"token_bucket\", capacity = 10,",
                "algorithm = \"token_bucket\",",
            ),
            "vendors.llm.levels[0].quotas[0].capacity",
            "burst capacity",
        ),
        (
            with(
                r#"count = 10, per = "1s" }]"#,
                r#"count = 0, per = "1s" }]"#,
            ),
            "vendors.sms.quotas[0].count",
            "at least 1",
        ),
        (
            with(r#"method = "POST""#, r#"method = "P O S T""#),
            "vendors.payments.routes[0].method",
            "not an HTTP method",
        ),
        (
            with(r#"algorithm = "leaky_bucket""#, r#"algorithm = "leaky""#),
            "vendors.llm.quotas[0].algorithm",
            "leaky",
        ),
        (
            with(
                r#"on_store_failure = "open""#,
                r#"on_store_failure = "sometimes""#,
            ),
            "vendors.payments.on_store_failure",
            "unknown variant `sometimes`",
        ),
        (
            with("throttles = [429, 420]", "throttles = [429, 420, 503]"),
            "vendors.sms.answers.throttles",
            "503 is in `failures` too",
        ),
        (
            with("throttles = [429, 420]", "throttles = [429, 42]"),
            "vendors.sms.answers.throttles",
            "42 is not an HTTP status",
        ),
        (
            with("throttles = [429, 420]", "throttles = [429, 70000]"),
            "vendors.sms.answers.throttles[1]",
            "expected u16",
        ),
        (
            with(
                r#"host = "api.sms.example""#,
                r#"host = "https://api.sms.example""#,
            ),
            "vendors.sms.host",
            "is not a host",
        ),
        (
            with(
                r#"path = "/v1/payments""#,
                r#"path = "/v1/payments?limit=10""#,
            ),
            "vendors.payments.routes[0].path",
            "a path pattern matches the path alone",
        ),
        (
            with("queue_capacity = 10000", "queue_capacity = 0"),
            "defaults.queue_capacity",
            "at least 1",
        ),
        (
            with(
                "retry = { max_attempts = 3 }",
                "retry = { max_attempts = 0 }",
            ),
            "defaults.retry.max_attempts",
            "at least 1",
        ),
        (
            with(
                "retry = { max_attempts = 3 }",
                "retry = { max_attempts = 3, budget = { ratio = -1.0 } }",
            ),
            "defaults.retry.budget.ratio",
            "zero or more",
        ),
        (
            with(r#"headroom = "5ms""#, r#"headroom = "2h""#),
            "defaults.headroom",
            "more than an hour",
        ),
        (with("[vendors.sms]", "[vendors.sms"), "(file)", "line"),
        (
            with(r#"name = "products""#, r#"name = "create-payment""#),
            "vendors.payments.routes[1].name",
            "names routes[0] too",
        ),
    ];
    for (outcome, field, problem) in cases {
        let error = outcome.expect_err("a malformed config");
        assert_eq!(error.field, field, "{error}");
        assert!(error.problem.contains(problem), "{error}");
    }
}

/// Every lane setting the builder has, the retry policy and the durations
/// people write, read from a file into the crate's own types.
#[test]
fn every_setting_reads_from_a_file() {
    let toml = r#"
        [defaults]
        quotas = [{ algorithm = "leaky_bucket", count = 10, per = "1 second" }]
        headroom = "2.5ms"
        max_wait = "1.5s"
        idle_timeout = "2 minutes"
        fallback_pause = { base = "500ms", cap = "30s" }
        adaptive = { decrease = 0.5 }
        batch_share = 7
        max_lanes = 100000
        redirects = 3
        tokens = "anthropic"
        answers = { throttles = [429, 420], out_of_credit = ["no_credit"] }
        retry = { max_attempts = 5, backoff = { base = "50ms", cap = "2s" }, budget = { ratio = 0.1 } }
    "#;
    let config = ShaperConfig::from_toml(toml).unwrap();
    let d = &config.defaults;
    assert_eq!(d.quotas, [Quota::leaky_bucket(10, SECOND)]);
    assert_eq!(d.headroom, Some(Duration::from_micros(2_500)));
    assert_eq!(d.max_wait, Some(Duration::from_millis(1_500)));
    assert_eq!(d.idle_timeout, Some(Duration::from_secs(120)));
    assert_eq!(d.max_lanes, Some(100_000));
    assert_eq!(d.redirects, Some(3));
    assert_eq!(d.tokens, Some(callshaper::tokens::TokenCost::anthropic()));
    assert_eq!(
        d.fallback_pause,
        Some(Backoff::new(
            Duration::from_millis(500),
            Duration::from_secs(30)
        ))
    );
    let adaptive = Adaptive {
        decrease: 0.5,
        ..Adaptive::default()
    };
    assert_eq!(d.adaptive, Some(adaptive));
    let enhance = reqwest::StatusCode::from_u16(420).unwrap();
    let answers = callshaper::Answers::default()
        .throttle(enhance)
        .never_out_of_credit()
        .out_of_credit("no_credit");
    assert_eq!(
        d.answers,
        Some(answers),
        "lists left out keep their defaults"
    );
    let retry = d.retry.clone().unwrap();
    let defaults = RetryPolicy::default();
    assert_eq!(retry.max_attempts, 5);
    assert_eq!(
        retry.max_throttles, defaults.max_throttles,
        "left out: default"
    );
    assert_eq!(
        retry.backoff,
        Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
    );
    assert_eq!(retry.budget.ratio, 0.1);
    assert_eq!(retry.budget.min_per_sec, defaults.budget.min_per_sec);

    let builder = config.builder().unwrap();
    let shown = format!("{builder:?}");
    for setting in [
        "batch_share: 7",
        "decrease: 0.5",
        "max_attempts: 5",
        "throttles: [429, 420]",
    ] {
        assert!(shown.contains(setting), "{setting} in {shown}");
    }
    config.build().unwrap();
}

/// The settings types are serde types: a quota writes as the flat table a
/// file declares and reads back the same, and is checked as it is read.
#[test]
fn settings_types_round_trip_and_are_checked_as_read() {
    let quota = Quota::token_bucket(10, 1, Duration::from_millis(1_500)).per_cost();
    let json = serde_json::to_string(&quota).unwrap();
    assert_eq!(
        json,
        r#"{"algorithm":"token_bucket","count":1,"per":"1.5s","capacity":10,"unit":"cost"}"#
    );
    assert_eq!(serde_json::from_str::<Quota>(&json).unwrap(), quota);

    let retry = RetryPolicy::default();
    let json = serde_json::to_string(&retry).unwrap();
    assert_eq!(serde_json::from_str::<RetryPolicy>(&json).unwrap(), retry);

    for (bad, problem) in [
        (
            r#"{"algorithm":"leaky_bucket","count":0,"per":"1s"}"#,
            "count",
        ),
        (
            r#"{"algorithm":"leaky_bucket","count":1,"per":"400 days"}"#,
            "per",
        ),
        (
            r#"{"algorithm":"sliding_log","count":1,"per":"1s","capacity":3}"#,
            "capacity",
        ),
        (
            r#"{"algorithm":"token_bucket","count":1,"per":"1 day","capacity":400}"#,
            "400 at 1 per 86400s takes longer than the longest window",
        ),
        (
            r#"{"algorithm":"leaky_bucket","count":1,"per":"-1s"}"#,
            "not a duration",
        ),
    ] {
        let error = serde_json::from_str::<Quota>(bad)
            .expect_err(bad)
            .to_string();
        assert!(error.contains(problem), "{bad}: {error}");
    }
}

/// A lane's snapshot serves as JSON, durations as text.
#[tokio::test(start_paused = true)]
async fn a_lane_snapshot_serializes() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = common::shaper(10).build().unwrap();
    shaper.get(vendor.uri()).send().await.unwrap();
    let json = serde_json::to_value(&shaper.lanes()[0]).unwrap();
    assert_eq!(json["released"], 1);
    assert_eq!(json["queued"], 0);
    assert_eq!(json["interval"], "100.5ms");
    assert!(json["paused_for"].is_null());
}

/// A custom meter is code, not data: serializing it is an error, not a
/// silent stand-in.
#[test]
fn a_custom_meter_does_not_serialize() {
    let rate = callshaper::Rate::new(10, SECOND);
    let custom = Quota::custom(callshaper::meters::CustomMeter::new(
        "mine",
        rate,
        move |headroom, _| Box::new(callshaper::meters::LeakyBucket::new(rate, headroom)),
    ));
    let error = serde_json::to_string(&custom).expect_err("code, not data");
    assert!(
        error.to_string().contains("`mine` is a custom meter"),
        "{error}"
    );
}

/// A vendor named by its base URL is matched by that URL's host and port,
/// and `host` with `upstream`, or neither, or an upstream that is not an
/// http(s) URL, is refused naming the field.
#[tokio::test(start_paused = true)]
async fn an_upstream_stands_in_for_the_vendors_host() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let other = Vendor::strict(10, SECOND).start().await;
    let file = format!(
        r#"
        [vendors.near]
        upstream = "{}/v1"
        quotas = [{{ algorithm = "leaky_bucket", count = 10, per = "1s" }}]
        "#,
        vendor.uri()
    );
    let shaper = ShaperConfig::from_toml(&file).unwrap().build().unwrap();
    shaper
        .get(format!("{}/v1/things", vendor.uri()))
        .send()
        .await
        .unwrap();
    // Same host, another port: not this vendor's, and nothing else is.
    let elsewhere = shaper.get(other.uri()).send().await;
    assert!(
        matches!(elsewhere, Err(Error::NoQuota { .. })),
        "{elsewhere:?}"
    );
    let lanes = shaper.lanes();
    assert_eq!(lanes.len(), 1);
    assert_eq!(lanes[0].released, 1);

    let quotas = r#"quotas = [{ algorithm = "leaky_bucket", count = 10, per = "1s" }]"#;
    let cases = [
        (
            format!("host = \"a.example\"\nupstream = \"https://a.example\"\n{quotas}"),
            "vendors.x.upstream",
            "not both",
        ),
        (quotas.to_owned(), "vendors.x.host", "needs `host"),
        (
            format!("upstream = \"ftp://a.example\"\n{quotas}"),
            "vendors.x.upstream",
            "not an http or https URL",
        ),
        (
            format!("upstream = \"a.example\"\n{quotas}"),
            "vendors.x.upstream",
            "not an http or https URL",
        ),
    ];
    for (vendor, field, problem) in cases {
        let file = format!("[vendors.x]\n{vendor}");
        let error = ShaperConfig::from_toml(&file)
            .and_then(|c| c.build())
            .expect_err(&file);
        assert_eq!(error.field, field, "{error}");
        assert!(error.problem.contains(problem), "{error}");
    }
}

/// A file of settings alone is a builder for quotas its caller adds (a
/// meter of their own, which no file can hold): it is not refused for
/// lacking them before the caller had the chance.
#[tokio::test]
async fn a_file_of_settings_alone_takes_the_callers_quotas() {
    let config = ShaperConfig::from_toml("[defaults]\nheadroom = \"5ms\"").unwrap();
    let builder = config.builder().expect("settings alone");
    builder.rate(10, SECOND).build().unwrap();
}

/// The `[proxy]` table's limits are named as the file names them: the
/// proxy's builder names its own methods.
#[tokio::test]
async fn the_proxy_settings_are_named_as_the_file_names_them() {
    let with_proxy = |line: &str| format!("{VENDORS}\n[proxy]\n{line}\n");
    for (text, field) in [
        (
            with_proxy("max_header_bytes = 10"),
            "proxy.max_header_bytes",
        ),
        (
            with_proxy(r#"header_read_timeout = "2h""#),
            "proxy.header_read_timeout",
        ),
        (
            with_proxy(r#"body_read_timeout = "0s""#),
            "proxy.body_read_timeout",
        ),
        (with_proxy(r#"send_timeout = "61m""#), "proxy.send_timeout"),
        (with_proxy("max_connections = 0"), "proxy.max_connections"),
        (
            with_proxy(r#"header_read_timeout = "999us""#),
            "proxy.header_read_timeout",
        ),
    ] {
        let config = ShaperConfig::from_toml(&text).unwrap();
        let shaper = config.build().unwrap();
        let error = config.proxy(shaper).build().expect_err(field);
        assert_eq!(error.field, field, "{error}");
    }
}

/// A vendor's default cost past what its quotas take of one request is
/// refused when the file is read: every request the proxy gave it to
/// would end at once with `CostTooHigh`.
#[test]
fn a_default_cost_no_quota_can_take_is_refused() {
    let costing = |cost: &str| {
        let text = EVERY_FIELD.replacen("cost = 100", &format!("cost = {cost}"), 1);
        ShaperConfig::from_toml(&text).unwrap().builder()
    };
    let error = costing("90001").expect_err("past the 90,000 tokens a minute");
    assert_eq!(error.field, "vendors.llm.proxy.cost");
    assert!(error.problem.contains("90000"), "{error}");
    assert!(costing("90000").is_ok(), "a cost the quotas take");
}

/// Every field a file can hold, with a value each: what the hostile sweep
/// below changes, one value at a time.
const EVERY_FIELD: &str = r#"
    [defaults]
    quotas = [{ algorithm = "leaky_bucket", count = 10, per = "1s" }]
    headroom = "2.5ms"
    max_wait = "1.5s"
    max_pause = "2m"
    queue_capacity = 10000
    max_in_flight = 8
    idle_timeout = "2 minutes"
    fallback_pause = { base = "500ms", cap = "30s" }
    adaptive = { decrease = 0.5, increase = 0.1, floor = 0.05 }
    batch_share = 7
    max_lanes = 100000
    redirects = 3
    tokens = { style = "openai", default_output = 1024 }
    answers = { throttles = [429, 420], failures = [500, 503], overloads = [529] }
    retry = { max_attempts = 5, max_throttles = 3, backoff = { base = "50ms", cap = "2s" }, budget = { ratio = 0.1, min_per_sec = 10, ttl = "10s" } }

    [vendors.llm]
    upstream = "http://127.0.0.1:9"
    proxy = { max_wait = "3s", cost = 100, priority = "batch" }
    quotas = [
      { algorithm = "token_bucket", capacity = 20, count = 10, per = "1s", strict = true },
      { algorithm = "sliding_log", count = 90000, per = "1m", unit = "cost" },
    ]

    [[vendors.llm.levels]]
    name = "customer"
    key = "tag"
    quotas = [{ algorithm = "fixed_window", count = 60, per = "1m" }]

    [[vendors.llm.routes]]
    name = "chat"
    method = "POST"
    path = "/v1/chat/*"
    quotas = [{ algorithm = "sliding_window", count = 1000, per = "1d" }]

    [vendors.sms]
    host = "api.sms.example"
    key = { header = "x-api-key" }
    quotas = [{ algorithm = "leaky_bucket", count = 10, per = "1s" }]

    [proxy]
    listen = "127.0.0.1:0"
    admin = "127.0.0.1:0"
    replay_body = 1048576
    max_header_bytes = 65536
    header_read_timeout = "10s"
    body_read_timeout = "1m"
    send_timeout = "1m"
    max_connections = 10000
    drain = "30s"
"#;

/// Where `text` holds a value: each bare number's span, and each quoted
/// string's (quotes included).
fn values(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let (mut spans, mut i) = (Vec::new(), 0);
    while i < bytes.len() {
        let start = i;
        if bytes[i] == b'"' {
            i += 1 + text[i + 1..].find('"').expect("a closed string") + 1;
            spans.push((start, i));
        } else if bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) {
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            spans.push((start, i));
        } else {
            i += 1;
        }
    }
    spans
}

/// Numbers past every type's bounds, negative, fractional, not a number,
/// and durations and strings no vendor or person should write.
const HOSTILE: &[&str] = &[
    "0",
    "-1",
    "0.5",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "1e308",
    "nan",
    "inf",
    "-inf",
    "\"\"",
    "\"0s\"",
    "\"-1s\"",
    "\"1ns\"",
    "\"18446744073709551615s\"",
    "\"18446744073709551615 days\"",
    "\"213503982334601d\"",
    "\"1e400s\"",
    "\"99999999999999999999999999999 ms\"",
    "\"soon\"",
    "\"\\u0000\"",
    "\"/\"",
    "\"*\"",
    "\"http://[::1\"",
    "\"é\"",
];

/// Every value a file holds, replaced by each hostile one in turn: the
/// file reads and builds (the shaper, the proxy, a reload onto a running
/// shaper), or is refused with a typed error naming a field; nothing
/// panics. A number from a file is a caller's number: `u64::MAX`, zero,
/// negative or not a number at all.
#[tokio::test(start_paused = true)]
async fn a_hostile_value_anywhere_in_a_file_builds_or_names_its_field() {
    let client = reqwest::Client::new();
    let base = ShaperConfig::from_toml(EVERY_FIELD).unwrap();
    let running = base
        .builder()
        .unwrap()
        .client(client.clone())
        .build()
        .unwrap();
    base.proxy(running.clone()).build().unwrap();
    let (mut built, mut refused, mut panics) = (0, 0, Vec::new());
    for (start, end) in values(EVERY_FIELD) {
        for value in HOSTILE {
            let text = format!("{}{value}{}", &EVERY_FIELD[..start], &EVERY_FIELD[end..]);
            let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let config = ShaperConfig::from_toml(&text)?;
                let shaper = config.builder()?.client(client.clone()).build()?;
                config.proxy(shaper).build()?;
                config.proxy.clone().unwrap_or_default().drain()?;
                config.reload(&running)
            }));
            let changed = format!("{} -> {value}", &EVERY_FIELD[start..end]);
            match attempt {
                Ok(Ok(())) => built += 1,
                Ok(Err(error)) => {
                    // A field of the file, by its path, a reload's too.
                    let named = ["defaults.", "vendors.", "proxy.", "(file)"]
                        .iter()
                        .any(|section| error.field.starts_with(section));
                    assert!(named, "{changed}: {error} names no field of the file");
                    assert!(!error.problem.is_empty(), "{changed}: {error}");
                    assert!(
                        error.to_string().starts_with("invalid `"),
                        "{changed}: {error}"
                    );
                    refused += 1;
                }
                Err(_) => panics.push(changed),
            }
        }
    }
    eprintln!(
        "{built} files built, {refused} refused, {} panicked",
        panics.len()
    );
    assert!(panics.is_empty(), "panicked: {panics:#?}");
    assert!(built > 0 && refused > 0, "{built} built, {refused} refused");
}

/// A `[client]` table gives the client the file's shaper sends through
/// its timeouts: a vendor silent past `read_timeout` fails the attempt as
/// a transport error, where the default client would wait for good (the
/// proxy's slot with it). Real time: the timeout is reqwest's timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_table_times_out_a_silent_vendor() {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(wiremock::ResponseTemplate::new(200).set_delay(10 * SECOND))
        .mount(&server)
        .await;
    let file = format!(
        r#"
        [defaults]
        retry = {{ max_attempts = 1 }}
        [vendors.v]
        host = "{}"
        quotas = [{{ algorithm = "leaky_bucket", count = 10, per = "1s" }}]
        [client]
        connect_timeout = "5s"
        read_timeout = "200ms"
        "#,
        server.uri().trim_start_matches("http://")
    );
    let config = ShaperConfig::from_toml(&file).unwrap();
    let shaper = config.build().unwrap();
    let started = std::time::Instant::now();
    let error = shaper.get(server.uri()).send().await.unwrap_err();
    let took = started.elapsed();
    let Error::Transport { source, .. } = &error else {
        panic!("{error}");
    };
    assert!(source.is_timeout(), "{source:?}");
    assert!(took < 5 * SECOND, "{took:?}");

    // A client of the caller's own has its own timeouts: beside the
    // table, which would be dropped, it is refused.
    let refused = config
        .builder()
        .unwrap()
        .client(reqwest::Client::new())
        .build()
        .unwrap_err();
    assert_eq!(refused.field, "client", "{refused}");
}

/// Each `[client]` timeout is at least a millisecond and at most a day;
/// any other value is refused naming it, whatever the file writes there.
#[test]
fn a_client_timeout_under_a_millisecond_or_past_a_day_is_refused() {
    for field in ["connect_timeout", "read_timeout", "timeout"] {
        for value in HOSTILE {
            let file = format!("[client]\n{field} = {value}\n");
            let Ok(config) = ShaperConfig::from_toml(&file) else {
                continue;
            };
            let error = config.builder().unwrap_err();
            assert_eq!(error.field, format!("client.{field}"), "{value}: {error}");
        }
        for (value, fits) in [
            ("\"1d\"", true),
            ("\"1ms\"", true),
            ("\"25h\"", false),
            ("\"999us\"", false),
        ] {
            let file = format!("[client]\n{field} = {value}\n");
            let built = ShaperConfig::from_toml(&file).unwrap().builder();
            assert_eq!(built.is_ok(), fits, "{field} = {value}");
        }
    }
}
