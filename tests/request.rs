//! reqwest's request API through the shaper, and the vendor's last answer
//! kept in every give-up error.

mod common;

use std::time::Duration;

use callshaper::route::{LaneKey, Level};
use callshaper::{Error, Quota, Shaper};
use common::{SECOND, shaper};
use reqwest::header::HeaderName;
use wiremock::matchers::{body_json, body_string, header, method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// Every verb and body helper arrives as reqwest would send it; the
/// server checks each was seen exactly once.
#[tokio::test(start_paused = true)]
async fn every_verb_and_body_helper_reaches_the_vendor() {
    let server = MockServer::start().await;
    let ok = ResponseTemplate::new(200);
    Mock::given(method("PUT"))
        .and(path("/items/7"))
        .and(body_json(serde_json::json!({ "name": "seven" })))
        .and(header("content-type", "application/json"))
        .respond_with(ok.clone())
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PATCH"))
        .and(path("/items/7"))
        .and(body_string("name=seven&size=7"))
        .respond_with(ok.clone())
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path("/items/7"))
        .and(header("authorization", "Basic dXNlcjpzZWNyZXQ="))
        .respond_with(ok.clone())
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("HEAD"))
        .and(path("/items"))
        .and(query_param("page", "2"))
        .and(query_param("sort", "name"))
        .and(header("x-one", "1"))
        .and(header("x-two", "2"))
        .respond_with(ok.clone())
        .expect(1)
        .mount(&server)
        .await;

    let shaper = shaper(10).build().unwrap();
    let base = server.uri();
    let item = format!("{base}/items/7");
    let put = shaper
        .put(&item)
        .json(&serde_json::json!({ "name": "seven" }))
        .send();
    assert_eq!(put.await.unwrap().status(), 200);
    let patch = shaper
        .patch(&item)
        .form(&[("name", "seven"), ("size", "7")]);
    assert_eq!(patch.send().await.unwrap().status(), 200);
    let delete = shaper.delete(&item).basic_auth("user", Some("secret"));
    assert_eq!(delete.send().await.unwrap().status(), 200);
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-one", "1".parse().unwrap());
    headers.insert("x-two", "2".parse().unwrap());
    let head = shaper
        .head(format!("{base}/items"))
        .query(&[("page", "2"), ("sort", "name")])
        .headers(headers);
    let copy = head.try_clone().expect("no stream: clonable");
    assert_eq!(copy.build().unwrap().method(), reqwest::Method::HEAD);
    assert_eq!(head.send().await.unwrap().status(), 200);
    server.verify().await;
}

/// A vendor failing with a JSON error: when the retries run out, the
/// error keeps its status, headers and body.
#[tokio::test(start_paused = true)]
async fn retries_exhausted_keep_the_vendors_last_answer() {
    let server = MockServer::start().await;
    let body = r#"{"error":{"message":"the model is overloaded","type":"server_error"}}"#;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(500)
                .insert_header("x-request-id", "req-42")
                .set_body_string(body),
        )
        .mount(&server)
        .await;
    let shaper = shaper(10).max_attempts(2).build().unwrap();
    let error = shaper.get(server.uri()).send().await.unwrap_err();
    let Error::RetriesExhausted {
        attempts,
        last_status,
        ..
    } = &error
    else {
        panic!("expected RetriesExhausted, got {error:?}");
    };
    assert_eq!((*attempts, last_status.as_u16()), (2, 500));
    let answer = error.answer().expect("the last answer");
    assert_eq!(answer.status, 500);
    assert_eq!(answer.headers["x-request-id"], "req-42");
    assert_eq!(answer.body, body);
}

/// A throttle asking for longer than `max_pause` ends the request with
/// the throttle itself: its `Retry-After` and its body.
#[tokio::test(start_paused = true)]
async fn a_pause_too_long_keeps_the_throttle() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("retry-after", "3600")
                .set_body_string("daily limit reached"),
        )
        .mount(&server)
        .await;
    let shaper = shaper(10)
        .max_pause(Duration::from_secs(60))
        .build()
        .unwrap();
    let error = shaper.get(server.uri()).send().await.unwrap_err();
    assert!(matches!(error, Error::PauseTooLong { .. }), "{error:?}");
    let answer = error.answer().expect("the throttle");
    assert_eq!(answer.status, 429);
    assert_eq!(answer.headers["retry-after"], "3600");
    assert_eq!(answer.body, "daily limit reached");
}

/// A hostile vendor's endless body is kept up to the limit, not read to
/// its end.
#[tokio::test(start_paused = true)]
async fn a_kept_body_stops_at_the_limit() {
    let server = MockServer::start().await;
    let huge = "x".repeat(callshaper::Answer::BODY_LIMIT * 4);
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(500).set_body_string(huge))
        .mount(&server)
        .await;
    let shaper = Shaper::builder()
        .rate(10, SECOND)
        .transport(callshaper::testing::HoldClock(reqwest::Client::new()))
        .max_attempts(1)
        .build()
        .unwrap();
    let error = shaper.get(server.uri()).send().await.unwrap_err();
    let answer = error.answer().expect("the last answer");
    assert_eq!(answer.body.len(), callshaper::Answer::BODY_LIMIT);
}

/// Each cause in an error chain is printed once: the error's own message
/// does not repeat its source's.
#[tokio::test(start_paused = true)]
async fn an_error_chain_prints_each_cause_once() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let shaper = shaper(10).max_attempts(1).build().unwrap();
    let error = shaper
        .get(format!("http://{closed}/"))
        .send()
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Transport { .. }), "{error:?}");
    let source = std::error::Error::source(&error).expect("the transport's error");
    assert!(!error.to_string().contains(&source.to_string()), "{error}");

    let invalid = shaper.get("http://exa mple.com/").send().await.unwrap_err();
    assert_eq!(invalid.to_string(), "invalid request");
    assert!(std::error::Error::source(&invalid).is_some());
}

/// A redirect is followed by the shaper, not its client: the second hop
/// waits for its own turn in the lane (a second at 1 a second), so no
/// hop reaches the vendor unmetered.
#[tokio::test(start_paused = true)]
async fn each_hop_of_a_redirect_takes_its_turn() {
    let server = MockServer::start().await;
    Mock::given(path("/old"))
        .respond_with(ResponseTemplate::new(301).insert_header("location", "/new"))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(path("/new"))
        .respond_with(ResponseTemplate::new(200).set_body_string("here"))
        .expect(1)
        .mount(&server)
        .await;
    let shaper = shaper(1).build().unwrap();
    let started = tokio::time::Instant::now();
    let response = shaper.get(format!("{}/old", server.uri())).send().await;
    let response = response.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.url().path(), "/new");
    assert_eq!(response.text().await.unwrap(), "here");
    let waited = started.elapsed();
    assert!((SECOND..2 * SECOND).contains(&waited), "{waited:?}");
}

/// A `303` after a `POST` fetches the result with a `GET` and no body; a
/// `307` sends the same method and body again.
#[tokio::test(start_paused = true)]
async fn see_other_gets_and_a_temporary_redirect_sends_again() {
    let server = MockServer::start().await;
    let to =
        |status, location: &str| ResponseTemplate::new(status).insert_header("location", location);
    Mock::given(method("POST"))
        .and(path("/jobs"))
        .respond_with(to(303, "/jobs/7"))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/jobs/7"))
        .and(body_string(""))
        .respond_with(ResponseTemplate::new(200))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/a"))
        .respond_with(to(307, "/b"))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/b"))
        .and(body_string("payload"))
        .respond_with(ResponseTemplate::new(204))
        .expect(1)
        .mount(&server)
        .await;
    let shaper = shaper(10).build().unwrap();
    let base = server.uri();
    let posted = shaper.post(format!("{base}/jobs")).body("job").send();
    assert_eq!(posted.await.unwrap().status(), 200);
    let put = shaper.put(format!("{base}/a")).body("payload").send();
    assert_eq!(put.await.unwrap().status(), 204);
}

/// A hop to another origin (here another port) carries no credentials:
/// no `Authorization`, no vendor's API-key header (which reqwest's own
/// redirects would send on), no header a level is keyed by. A hop on the
/// same origin keeps them all.
#[tokio::test(start_paused = true)]
async fn credentials_stay_with_their_origin() {
    let (home, abroad) = (MockServer::start().await, MockServer::start().await);
    Mock::given(path("/here"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", "/still-here"))
        .mount(&home)
        .await;
    let elsewhere = format!("{}/there", abroad.uri());
    Mock::given(path("/still-here"))
        .and(header("authorization", "Bearer key"))
        .and(header("x-api-key", "sk-ant"))
        .and(header("x-tenant-key", "acme-secret"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", elsewhere.as_str()))
        .expect(1)
        .mount(&home)
        .await;
    Mock::given(path("/there"))
        .respond_with(ResponseTemplate::new(200))
        .expect(1)
        .mount(&abroad)
        .await;
    let tenant = HeaderName::from_static("x-tenant-key");
    let per_tenant = Quota::leaky_bucket(10, SECOND);
    let shaper = shaper(10)
        .level(Level::new("tenant", LaneKey::Header(tenant), [per_tenant]))
        .build()
        .unwrap();
    let sent = shaper
        .get(format!("{}/here", home.uri()))
        .bearer_auth("key")
        .header("x-api-key", "sk-ant")
        .header("x-tenant-key", "acme-secret")
        .header("x-request-id", "r-1");
    assert_eq!(sent.send().await.unwrap().status(), 200);
    let abroad = abroad.received_requests().await.unwrap();
    let headers = &abroad[0].headers;
    for secret in ["authorization", "x-api-key", "x-tenant-key"] {
        assert!(headers.get(secret).is_none(), "{secret} went abroad");
    }
    assert_eq!(headers["x-request-id"], "r-1");
}

/// Past the limit the last redirect is the answer, and no more hops are
/// sent: the shaper's limit, or the request's own (0: none followed).
#[tokio::test(start_paused = true)]
async fn redirects_stop_at_their_limit() {
    let server = MockServer::start().await;
    Mock::given(path("/loop"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", "/loop"))
        .mount(&server)
        .await;
    let shaper = shaper(100).redirects(2).build().unwrap();
    let url = format!("{}/loop", server.uri());
    assert_eq!(shaper.get(&url).send().await.unwrap().status(), 302);
    assert_eq!(server.received_requests().await.unwrap().len(), 3);
    let once = shaper.get(&url).redirects(0).send().await.unwrap();
    assert_eq!(once.status(), 302);
    assert_eq!(once.headers()["location"], "/loop");
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
}
