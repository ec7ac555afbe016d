//! The shaper served as a reverse proxy (`callshaper::proxy`), driven by
//! real clients: Python's standard library, raw TCP and reqwest, against
//! wiremock vendors and a streaming upstream. Clients that misbehave
//! (hostile heads, stalled bodies, clients that go or stop reading) are
//! `proxy_clients.rs`'s.

mod common;

use std::process::Command;

use callshaper::Shaper;
use callshaper::testing::Vendor;
use common::proxy::{answering_ok, proxy_of, serve};
use common::{SECOND, answering_once};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

/// Sixty concurrent calls from Python's standard library (a thread each,
/// `urllib`) through the proxy to a vendor that allows 10 a second in
/// any window: none refused, none failed, done at the vendor's pace
/// (59 intervals after the first: 5.9 s, plus the loopback's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_is_shaped_by_changing_its_base_url() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    // The proxy's hop and Python's threads add jitter the lane's clock does
    // not see: the default 5 ms headroom let one 429 through in a full
    // `.ci/run` on two busy cores; 30 ms is the fleet tests' headroom for
    // the same jitter.
    let shaper = Shaper::builder()
        .rate(10, SECOND)
        .headroom(std::time::Duration::from_millis(30))
        .build()
        .unwrap();
    let address = serve(proxy_of(shaper, "vendor", &vendor.uri())).await;
    let script = r#"
import json, sys, threading, time, urllib.request, urllib.error
base = sys.argv[1]
statuses = [None] * 60
def call(i):
    try:
        with urllib.request.urlopen(base + "/vendor/v1/things?i=%d" % i, timeout=60) as r:
            statuses[i] = r.status
    except urllib.error.HTTPError as e:
        statuses[i] = e.code
    except Exception as e:
        statuses[i] = repr(e)
start = time.monotonic()
threads = [threading.Thread(target=call, args=(i,)) for i in range(60)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"statuses": statuses, "elapsed": time.monotonic() - start}))
"#;
    let base = format!("http://{address}");
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args(["-c", script, &base])
            .output()
            .expect("python3 runs (scripts/test needs it)")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let statuses = report["statuses"].as_array().unwrap();
    let elapsed = report["elapsed"].as_f64().unwrap();
    eprintln!("60 calls from Python through the proxy: {elapsed:.2} s");
    assert!(statuses.iter().all(|s| s == 200), "{statuses:?}");
    assert_eq!(vendor.throttled(), 0);
    assert_eq!(vendor.arrivals().len(), 60);
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    // At the pace, not faster (the vendor's window says so too); a loaded
    // machine may be slower, but no retry storm takes 20 s.
    assert!((5.5..20.0).contains(&elapsed), "{elapsed:.2} s");
}

/// The vendor gets what the client sent, without hop-by-hop headers,
/// `Host` or the shaper's controls; the client gets the vendor's status,
/// headers and body.
#[tokio::test]
async fn only_end_to_end_headers_cross() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(
            ResponseTemplate::new(201)
                .insert_header("x-vendor", "yes")
                .set_body_string("made"),
        )
        .mount(&server)
        .await;
    let shaper = Shaper::builder().rate(100, SECOND).build().unwrap();
    let address = serve(proxy_of(shaper, "v", &format!("{}/api", server.uri()))).await;
    let response = reqwest::Client::new()
        .post(format!("http://{address}/v/items?x=1"))
        .header("connection", "x-hop")
        .header("x-hop", "1")
        .header("proxy-authorization", "Basic Zm9v")
        .header("x-callshaper-cost", "1")
        .header("authorization", "Bearer key")
        .body("payload")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["x-vendor"], "yes");
    assert_eq!(response.text().await.unwrap(), "made");
    let received = server.received_requests().await.unwrap();
    let request = &received[0];
    assert_eq!(request.url.path(), "/api/items");
    assert_eq!(request.url.query(), Some("x=1"));
    assert_eq!(request.body, b"payload");
    assert_eq!(request.headers["authorization"], "Bearer key");
    for hop in ["x-hop", "proxy-authorization", "x-callshaper-cost"] {
        assert!(!request.headers.contains_key(hop), "{hop} crossed");
    }
    let host = server.address().to_string();
    assert_eq!(request.headers["host"], host.as_str());
}

/// Nothing goes anywhere but a configured upstream: an unknown prefix
/// gets 404 naming the configured ones, an absolute-form target 405.
#[tokio::test]
async fn nothing_is_forwarded_elsewhere() {
    let server = MockServer::start().await;
    let shaper = Shaper::builder().rate(100, SECOND).build().unwrap();
    let address = serve(proxy_of(shaper, "v", &server.uri())).await;
    let response = reqwest::get(format!("http://{address}/other/x"))
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(
        response.headers()["x-callshaper-reason"],
        "unknown_upstream"
    );
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("configured: v")
    );
    let mut raw = TcpStream::connect(&address).await.unwrap();
    let absolute = format!("GET {}/x HTTP/1.1\r\nhost: evil\r\n\r\n", server.uri());
    raw.write_all(absolute.as_bytes()).await.unwrap();
    let mut head = [0; 12];
    raw.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 405");
    assert!(server.received_requests().await.unwrap().is_empty());
}

/// A path cannot climb out of its upstream's base, however it spells the
/// climb: a URL parser takes `\` for `/` in an `http` URL and `%2e` for
/// `.`, HTTP lets a client send both raw, and a vendor may decode `%2f`
/// or drop a segment's `;` parameters before it routes. Each is refused
/// with 400, and the vendor hears nothing; a backslash that climbs
/// nowhere reaches it as written.
#[tokio::test]
async fn no_path_climbs_out_of_the_upstreams_base() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let shaper = Shaper::builder().rate(100, SECOND).build().unwrap();
    let base = format!("{}/v1", server.uri());
    let address = serve(proxy_of(shaper, "v", &base)).await;
    for climb in [
        "/v/../admin",
        "/v/..\\admin",
        "/v/a\\..\\..\\admin",
        "/v/%2e%2e\\admin",
        "/v/x/.%2E\\..\\y",
        "/v/..%2fadmin",
        "/v/..;/admin",
    ] {
        let mut raw = TcpStream::connect(&address).await.unwrap();
        let request = format!("GET {climb} HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\n\r\n");
        raw.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        raw.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{climb}: {answer}");
        assert!(answer.contains("dot_segment"), "{climb}: {answer}");
    }
    assert!(server.received_requests().await.unwrap().is_empty());
    // A backslash that climbs nowhere goes under the base, as written.
    let mut raw = TcpStream::connect(&address).await.unwrap();
    let request = "GET /v/a\\b HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\n\r\n";
    raw.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let received = server.received_requests().await.unwrap();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].url.path(), "/v1/a%5Cb");
}

/// A request whose wait would pass the client's deadline is answered by
/// the proxy at once: 429, the reason, and a `Retry-After` computed from
/// the lane's predicted wait.
#[tokio::test]
async fn a_deadline_the_lane_cannot_meet_is_answered_at_once() {
    let server = answering_ok().await;
    let shaper = Shaper::builder().rate(1, 3 * SECOND).build().unwrap();
    let address = serve(proxy_of(shaper, "v", &server.uri())).await;
    let client = reqwest::Client::new();
    let url = format!("http://{address}/v/x");
    let waiting = |max_wait: &'static str| {
        let request = client.get(&url).header("x-callshaper-max-wait", max_wait);
        async move { request.send().await.unwrap() }
    };
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    let response = waiting("100ms").await;
    assert_eq!(response.status(), 429);
    assert_eq!(
        response.headers()["x-callshaper-reason"],
        "would_exceed_max_wait"
    );
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The next slot is 3 s and the headroom after the first, rounded up.
    assert!((3..=4).contains(&retry_after), "{retry_after}");
    assert_eq!(waiting("soon").await.status(), 400);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

/// The same with `curl -N`, as an operator checks a stream by hand: curl
/// prints the first event while the upstream still holds the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_prints_each_event_as_it_comes() {
    let (base, first_read) = two_events().await;
    let shaper = Shaper::builder().rate(10, SECOND).build().unwrap();
    let address = serve(proxy_of(shaper, "sse", &base)).await;
    let mut curl = Command::new("curl")
        .args([
            "-sN",
            "--max-time",
            "20",
            &format!("http://{address}/sse/events"),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("curl runs (scripts/test needs it)");
    let stdout = curl.stdout.take().unwrap();
    let (printed, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = printed.send(line.unwrap());
        }
    });
    let first = tokio::time::timeout(5 * SECOND, lines.recv())
        .await
        .expect("curl prints the first event while the upstream holds the second");
    assert_eq!(first.as_deref(), Some("data: one"));
    first_read.send(()).await.unwrap();
    let mut rest = Vec::new();
    while let Some(line) = lines.recv().await {
        rest.push(line);
    }
    assert_eq!(rest, ["", "data: two", ""]);
    let status = tokio::task::spawn_blocking(move || curl.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
}

/// A vendor's defaults in the file stand in for the headers a client did
/// not send, and a header the client did send wins.
#[tokio::test]
async fn a_vendors_defaults_stand_in_for_headers_not_sent() {
    let server = answering_ok().await;
    let file = format!(
        r#"
        [vendors.v]
        upstream = "{}"
        quotas = [{{ algorithm = "leaky_bucket", count = 1, per = "3s" }}]
        proxy = {{ max_wait = "100ms", priority = "batch" }}
        "#,
        server.uri()
    );
    let config = callshaper::config::ShaperConfig::from_toml(&file).unwrap();
    let address = serve(config.proxy(config.build().unwrap())).await;
    let client = reqwest::Client::new();
    let url = format!("http://{address}/v/x");
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    let defaulted = client.get(&url).send().await.unwrap();
    assert_eq!(defaulted.status(), 429);
    assert_eq!(
        defaulted.headers()["x-callshaper-reason"],
        "would_exceed_max_wait"
    );
    let said = client
        .get(&url)
        .header("x-callshaper-max-wait", "10s")
        .send()
        .await
        .unwrap();
    assert_eq!(said.status(), 200);
    assert_eq!(server.received_requests().await.unwrap().len(), 2);

    let unserved = r#"
        [vendors.v]
        host = "api.v.example"
        quotas = [{ algorithm = "leaky_bucket", count = 1, per = "3s" }]
        proxy = { max_wait = "100ms" }
    "#;
    let config = callshaper::config::ShaperConfig::from_toml(unserved).unwrap();
    let error = config.build().unwrap_err().to_string();
    assert!(error.contains("vendors.v.proxy"), "{error}");
    let garbage = r#"
        [vendors.v]
        upstream = "http://127.0.0.1:1"
        quotas = [{ algorithm = "leaky_bucket", count = 1, per = "3s" }]
        proxy = { max_wait = "soon", priority = "urgent" }
    "#;
    let error = callshaper::config::ShaperConfig::from_toml(garbage)
        .unwrap_err()
        .to_string();
    assert!(error.contains("vendors.v.proxy.max_wait"), "{error}");
}

/// An upstream of server-sent events that sends its first event, and its
/// second only once told (the client has the first): its base URL, and
/// the sender that tells it.
async fn two_events() -> (String, tokio::sync::mpsc::Sender<()>) {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", upstream.local_addr().unwrap());
    let (first_read, mut first_seen) = tokio::sync::mpsc::channel::<()>(1);
    tokio::spawn(async move {
        let (mut stream, _) = upstream.accept().await.unwrap();
        let mut request = vec![0; 4096];
        let _ = stream.read(&mut request).await.unwrap();
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        let event = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
        stream
            .write_all(event("data: one\n\n").as_bytes())
            .await
            .unwrap();
        first_seen.recv().await;
        stream
            .write_all(event("data: two\n\n").as_bytes())
            .await
            .unwrap();
        stream.write_all(b"0\r\n\r\n").await.unwrap();
    });
    (base, first_read)
}

/// Server-sent events pass through one by one: the client reads the
/// first event while the upstream has not sent the second yet (it waits
/// for the client's word that the first arrived).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_client_before_the_upstream_ends() {
    let (base, first_read) = two_events().await;
    let shaper = Shaper::builder().rate(10, SECOND).build().unwrap();
    let address = serve(proxy_of(shaper, "sse", &base)).await;
    let mut response = reqwest::get(format!("http://{address}/sse/events"))
        .await
        .unwrap();
    let first = tokio::time::timeout(5 * SECOND, response.chunk())
        .await
        .expect("the first event arrives while the upstream still holds the second")
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"data: one\n\n");
    first_read.send(()).await.unwrap();
    let second = response.chunk().await.unwrap().unwrap();
    assert_eq!(&second[..], b"data: two\n\n");
    assert!(response.chunk().await.unwrap().is_none());
}

/// A body over `replay_body` streams to the vendor whole and is sent once:
/// the vendor's 429 for it reaches the client as sent. A body within it
/// is kept, sent again after the same 429, and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_streams_once_and_a_small_one_is_sent_again() {
    let throttle = || ResponseTemplate::new(429).insert_header("retry-after", "1");
    let (large_vendor, small_vendor) = (
        answering_once(throttle()).await,
        answering_once(throttle()).await,
    );
    let shaper = Shaper::builder().rate(100, SECOND).build().unwrap();
    let proxy = proxy_of(shaper, "large", &large_vendor.uri())
        .upstream("small", small_vendor.uri())
        .replay_body(1_000);
    let address = serve(proxy).await;
    let client = reqwest::Client::new();
    let large: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();

    let answer = client
        .post(format!("http://{address}/large/large"))
        .body(large.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["retry-after"], "1");
    let small = client
        .post(format!("http://{address}/small/small"))
        .body("a small body")
        .send()
        .await
        .unwrap();
    assert_eq!(small.status(), 200);

    let bodies = |vendor: MockServer, route: &'static str| async move {
        let received = vendor.received_requests().await.unwrap();
        received
            .into_iter()
            .filter(|r| r.url.path() == route)
            .map(|r| r.body)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        bodies(large_vendor, "/large").await,
        vec![large],
        "streamed whole, once"
    );
    assert_eq!(
        bodies(small_vendor, "/small").await,
        vec![b"a small body".to_vec(); 2]
    );
}

/// A body over `replay_body` streams: the upstream has its first part
/// while the client still holds the rest back, and then gets it all.
/// Kept whole before sending, the first part would never arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_reaches_the_vendor_before_the_client_finishes_it() {
    const LENGTH: usize = 20_000;
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", upstream.local_addr().unwrap());
    let (begun, mut upstream_begun) = tokio::sync::mpsc::channel::<()>(1);
    tokio::spawn(async move {
        let (mut stream, _) = upstream.accept().await.unwrap();
        let mut read = Vec::new();
        let mut buf = vec![0; 8192];
        let mut told = false;
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the proxy closed before the body's end");
            read.extend_from_slice(&buf[..n]);
            let Some(head) = read.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let body = read.len() - head - 4;
            if body > 1_000 && !told {
                begun.send(()).await.unwrap();
                told = true;
            }
            if body >= LENGTH {
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{body:05}");
                stream.write_all(answer.as_bytes()).await.unwrap();
                return;
            }
        }
    });
    let shaper = Shaper::builder().rate(100, SECOND).build().unwrap();
    let address = serve(proxy_of(shaper, "up", &base).replay_body(1_000)).await;

    let mut client = TcpStream::connect(&address).await.unwrap();
    let head = format!("POST /up/x HTTP/1.1\r\nhost: a\r\ncontent-length: {LENGTH}\r\n\r\n");
    client.write_all(head.as_bytes()).await.unwrap();
    client.write_all(&[b'x'; 5_000]).await.unwrap();
    tokio::time::timeout(10 * SECOND, upstream_begun.recv())
        .await
        .expect("the upstream has the body's first part before its end is sent");
    client.write_all(&[b'x'; LENGTH - 5_000]).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = vec![0; 1024];
    while !String::from_utf8_lossy(&answer).ends_with(&format!("{LENGTH:05}")) {
        let n = tokio::time::timeout(10 * SECOND, client.read(&mut buf))
            .await
            .expect("the answer")
            .unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200"));
}

/// The proxy relays a redirect rather than following it, with a
/// `Location` under the upstream's base kept under the proxy: the client
/// follows it through the proxy, so that hop takes its turn too (as
/// nginx's `proxy_redirect default` keeps clients on the proxy).
#[tokio::test]
async fn a_redirect_is_relayed_and_followed_through_the_proxy() {
    let server = MockServer::start().await;
    let moved = format!("{}/v1/new?page=2", server.uri());
    Mock::given(wiremock::matchers::path("/v1/old"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", moved.as_str()))
        .expect(2)
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::path("/v1/new"))
        .respond_with(ResponseTemplate::new(200).set_body_string("moved here"))
        .expect(1)
        .mount(&server)
        .await;
    let shaper = Shaper::builder().rate(100, SECOND).build().unwrap();
    let base = format!("{}/v1", server.uri());
    let address = serve(proxy_of(shaper, "vendor", &base)).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let relayed = client
        .get(format!("http://{address}/vendor/old"))
        .send()
        .await
        .unwrap();
    assert_eq!(relayed.status(), 302);
    assert_eq!(relayed.headers()["location"], "/vendor/new?page=2");
    // A client that follows redirects stays on the proxy.
    let followed = reqwest::get(format!("http://{address}/vendor/old"))
        .await
        .unwrap();
    assert_eq!(followed.url().authority(), address);
    assert_eq!(followed.url().path(), "/vendor/new");
    assert_eq!(followed.text().await.unwrap(), "moved here");
}

/// A proxy's debug output, and its builder's, names its upstreams and
/// limits, never its client token: a debug line in a log is not a place
/// for a secret.
#[tokio::test]
async fn a_proxys_debug_output_keeps_its_token_out() {
    let shaper = common::shaper(10).build().unwrap();
    let builder = proxy_of(shaper, "vendor", "http://127.0.0.1:9").client_token("s3cret-token");
    let shown = format!("{builder:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    let proxy = builder.build().unwrap();
    let shown = format!("{proxy:?}");
    assert!(shown.contains("http://127.0.0.1:9"), "{shown}");
    assert!(shown.contains("client_token: true"), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
}

/// A default cost that no quota on its upstream's way can take is refused
/// when the proxy is built, naming the upstream's defaults: it would end
/// every request it is given, at once, with `CostTooHigh`. The bound is
/// the most any route to that host allows: a route that takes only some
/// of its paths counts, as some requests may go there.
#[tokio::test]
async fn a_default_cost_no_quota_on_its_way_can_take_is_refused() {
    use callshaper::route::Route;
    use callshaper::shaper::RequestOptions;
    use callshaper::{Error, Quota};

    let tokens = |count| Quota::sliding_log(count, 60 * SECOND).per_cost();
    let shaper = || {
        Shaper::builder()
            .rate(10, SECOND)
            .quota(tokens(90_000))
            .route(
                Route::new("batch")
                    .host("batch.example")
                    .path("/v1/batches/*")
                    .alone()
                    .quota(tokens(1_000_000)),
            )
            .build()
            .unwrap()
    };
    let costing = |base: &str, cost: u64| {
        let mut options = RequestOptions::default();
        options.cost = Some(cost);
        proxy_of(shaper(), "v", base).defaults("v", options).build()
    };
    let error = costing("http://llm.example", 90_001).expect_err("past 90,000 a minute");
    assert_eq!(error.field, "defaults.v.cost", "{error}");
    assert!(error.problem.contains("90000"), "{error}");
    assert!(costing("http://llm.example", 90_000).is_ok());
    // Its batches take a million; its other paths, 90,000.
    assert!(costing("http://batch.example", 1_000_000).is_ok());
    let error = costing("http://batch.example", 1_000_001).expect_err("past any route");
    assert!(error.problem.contains("1000000"), "{error}");

    // What the check spares a user: the request itself ends at once.
    let refused = shaper()
        .get("http://llm.example/v1")
        .cost(90_001)
        .send()
        .await
        .expect_err("no quota takes it");
    assert!(matches!(refused, Error::CostTooHigh { .. }), "{refused}");
}
