//! `dashboards/callshaper.json` against what metrics-exporter-prometheus
//! really renders: every series a panel queries exists, with every label
//! the query groups by or the legend shows, and has HELP text.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use callshaper::store::StoreFailure;
use callshaper::testing::{RedisServer, RetryAfter, Vendor};
use callshaper::{Error, Quota, Shaper};
use common::{SECOND, burst};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Series by name, each as its set of label names.
fn rendered_series(text: &str) -> BTreeMap<String, Vec<BTreeSet<String>>> {
    let mut series: BTreeMap<String, Vec<BTreeSet<String>>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, labels) = match line.split_once('{') {
            Some((name, rest)) => (name, rest.split_once('}').map_or("", |(l, _)| l)),
            None => (line.split_whitespace().next().unwrap_or(""), ""),
        };
        let names = labels
            .split("\",")
            .filter_map(|pair| pair.split_once('='))
            .map(|(key, _)| key.trim().to_owned())
            .collect();
        series.entry(name.to_owned()).or_default().push(names);
    }
    series
}

/// Every `callshaper_…` name in a query.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("callshaper_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The labels a query groups by (`by (a, b)`) and its legend shows
/// (`{{a}}`).
fn used_labels(expr: &str, legend: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("by (") {
        let tail = &rest[at + 4..];
        let end = tail.find(')').expect("a closed by clause");
        labels.extend(tail[..end].split(',').map(|l| l.trim().to_owned()));
        rest = &tail[end..];
    }
    let mut rest = legend;
    while let Some(at) = rest.find("{{") {
        let tail = &rest[at + 2..];
        let end = tail.find("}}").expect("a closed legend field");
        labels.insert(tail[..end].trim().to_owned());
        rest = &tail[end..];
    }
    labels
}

/// Traffic that makes every series: a throttle, a refusal, a learned
/// quota, a wait, and a lane on a Redis store.
async fn traffic() {
    let vendor = Vendor::strict(5, SECOND).announcing_policy().start().await;
    let shaper = Shaper::builder()
        .rate(10, SECOND)
        .quota(Quota::sliding_log(100, SECOND).per_cost())
        .build()
        .unwrap();
    vendor.throttle_for(Duration::from_millis(300), RetryAfter::Seconds(1));
    for outcome in burst(&shaper, &vendor.uri(), 8).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let too_costly = shaper.get(vendor.uri()).cost(1_000).send().await;
    assert!(matches!(too_costly, Err(Error::CostTooHigh { .. })));

    let redis = RedisServer::start();
    let store = redis.options().connect(&redis.url()).await.unwrap();
    let fleet = Shaper::builder()
        .rate(10, SECOND)
        .store(store)
        .on_store_failure(StoreFailure::Closed)
        .build()
        .unwrap();
    let other = Vendor::strict(10, SECOND).start().await;
    assert_eq!(fleet.get(other.uri()).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn every_dashboard_query_finds_its_series_and_labels() {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("callshaper_wait_seconds".to_owned()),
            &[0.01, 0.1, 1.0, 10.0],
        )
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    {
        let _recording = metrics::set_default_local_recorder(&recorder);
        traffic().await;
    }
    let text = handle.render();
    let series = rendered_series(&text);

    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../dashboards/callshaper.json"))
            .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6, "{} panels", panels.len());
    let mut queried = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().expect("a title");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("an expr");
            let legend = target["legendFormat"].as_str().unwrap_or("");
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title}: {expr} queries nothing of ours");
            for name in names {
                let found = series
                    .get(&name)
                    .unwrap_or_else(|| panic!("{title}: {name} is not rendered:\n{text}"));
                for label in used_labels(expr, legend) {
                    assert!(
                        found.iter().any(|labels| labels.contains(&label)),
                        "{title}: {name} has no `{label}` label: {found:?}"
                    );
                }
                let family = name.trim_end_matches("_bucket");
                assert!(
                    text.contains(&format!("# HELP {family} ")),
                    "{title}: {family} has no HELP"
                );
                queried.insert(family.to_owned());
            }
        }
    }
    // The panels the issue asks for: queue depth, waits, releases against
    // the quota, throttles by cause, the store mode.
    for needed in [
        "callshaper_queue_depth",
        "callshaper_wait_seconds",
        "callshaper_released_total",
        "callshaper_quota_rate",
        "callshaper_throttles_total",
        "callshaper_store_mode",
    ] {
        assert!(queried.contains(needed), "no panel queries {needed}");
    }
}
