//! A shaper declared in a file: the shipped `examples/vendors.toml` runs
//! against embedded vendors, and a malformed file names its field.

mod common;

use std::time::Duration;

use callshaper::testing::{HoldClock, Vendor};
use callshaper::{Error, ShaperConfig};
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
        config.vendors.get_mut(name).unwrap().host = host_of(vendor);
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

    let elsewhere = shaper.get("http://127.0.0.1:1/unknown").send().await;
    assert!(
        matches!(elsewhere, Err(Error::NoQuota { .. })),
        "{elsewhere:?}"
    );
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
    assert_eq!(config.vendors["sms"].quotas[0].count, 10);
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
                r#"count = 90000, per = "1 minute""#,
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
        (with("[vendors.sms]", "[vendors.sms"), "(file)", "line"),
    ];
    for (outcome, field, problem) in cases {
        let error = outcome.expect_err("a malformed config");
        assert_eq!(error.field, field, "{error}");
        assert!(error.problem.contains(problem), "{error}");
    }
}
