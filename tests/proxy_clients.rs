//! The proxy against clients that misbehave: a head too large or too
//! slow, a body cut off or left silent, a client that goes or stops
//! reading its answer; and a vendor that switches protocols unasked. Each
//! gets a status or a closed connection, frees what it held (its vendor
//! call, its lane's in-flight slot), and every other client is served as
//! before. Raw TCP clients and upstreams, real
//! time: the timeouts are the proxy's clock.

mod common;

use std::time::Duration;

use callshaper::Shaper;
use common::SECOND;
use common::proxy::{answering_ok, one_in_flight, proxy_of, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Hostile clients get a clear status or a closed connection, nothing is
/// forwarded for them, and the proxy goes on serving everyone else: a
/// head over the limit gets 431, a body cut off half-way 400, and a
/// client that never finishes its head is disconnected, as is one that
/// sends no next request on its kept-alive connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_get_a_status_and_others_are_served() {
    let server = answering_ok().await;
    let shaper = Shaper::builder().rate(100, SECOND).build().unwrap();
    let proxy = proxy_of(shaper, "v", &server.uri())
        .replay_body(1_000)
        .header_read_timeout(Duration::from_millis(300));
    let address = serve(proxy).await;
    let status_of = |request: Vec<u8>, close_write: bool| {
        let address = address.clone();
        async move {
            let mut raw = TcpStream::connect(&address).await.unwrap();
            raw.write_all(&request).await.unwrap();
            if close_write {
                raw.shutdown().await.unwrap();
            }
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(5 * SECOND, raw.read_to_end(&mut answer)).await;
            String::from_utf8_lossy(&answer)
                .chars()
                .take(12)
                .collect::<String>()
        }
    };
    let huge = format!(
        "GET /v/x HTTP/1.1\r\nhost: a\r\nx-big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    assert_eq!(status_of(huge.into_bytes(), false).await, "HTTP/1.1 431");
    let cut = b"POST /v/x HTTP/1.1\r\nhost: a\r\ncontent-length: 100\r\n\r\nonly ten b".to_vec();
    assert_eq!(status_of(cut, true).await, "HTTP/1.1 400");
    // Half a head, then nothing: disconnected after the timeout, answered
    // with nothing.
    let slow = b"GET /v/x HTTP/1.1\r\nhost: a\r\n".to_vec();
    let started = std::time::Instant::now();
    let answer = status_of(slow, false).await;
    assert!(!answer.starts_with("HTTP/1.1 2"), "{answer}");
    assert!(started.elapsed() < 4 * SECOND, "{:?}", started.elapsed());
    assert!(server.received_requests().await.unwrap().is_empty());
    let served = reqwest::get(format!("http://{address}/v/x")).await.unwrap();
    assert_eq!(served.status(), 200);
    // Kept alive for a next request, then idle: the connection (and the
    // buffers it holds) is closed after the same timeout, not kept for
    // good.
    let mut idle = TcpStream::connect(&address).await.unwrap();
    for _ in 0..2 {
        idle.write_all(b"GET /v/x HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(idle.read_u8().await.unwrap());
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
        let length = String::from_utf8_lossy(&head)
            .lines()
            .find_map(|line| line.strip_prefix("content-length: ")?.parse::<usize>().ok())
            .expect("a content-length");
        idle.read_exact(&mut vec![0; length]).await.unwrap();
    }
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(5 * SECOND, idle.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "an idle connection stayed open 5 s");
    assert!(rest.is_empty(), "{rest:?}");
}

/// A streamed answer holds its lane's in-flight slot until the client
/// goes: with `max_in_flight(1)`, a second client waits while the first
/// reads an endless event stream, and once the first disconnects the
/// upstream call ends (the upstream sees its connection close) and the
/// second goes. Real time: the "still waiting" check can only pass late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_holds_its_slot_until_the_client_goes() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", upstream.local_addr().unwrap());
    let arrivals = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (closed, mut upstream_closed) = tokio::sync::mpsc::channel::<()>(4);
    let counted = arrivals.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = upstream.accept().await.unwrap();
            let (counted, closed) = (counted.clone(), closed.clone());
            tokio::spawn(async move {
                let mut request = vec![0; 4096];
                let _ = stream.read(&mut request).await;
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let event = "c\r\ndata: tick\n\n\r\n";
                let _ = stream.write_all(format!("{head}{event}").as_bytes()).await;
                // Never ends by itself: only the proxy closing it does.
                let mut rest = [0u8; 64];
                while matches!(stream.read(&mut rest).await, Ok(n) if n > 0) {}
                let _ = closed.send(()).await;
            });
        }
    });
    let shaper = one_in_flight();
    let address = serve(proxy_of(shaper, "sse", &base)).await;
    let arrived = || arrivals.load(std::sync::atomic::Ordering::SeqCst);

    let mut first = reqwest::get(format!("http://{address}/sse/a"))
        .await
        .unwrap();
    assert_eq!(
        &first.chunk().await.unwrap().unwrap()[..],
        b"data: tick\n\n"
    );
    let second = tokio::spawn(reqwest::get(format!("http://{address}/sse/b")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(arrived(), 1, "the first stream holds the slot");

    drop(first);
    tokio::time::timeout(10 * SECOND, upstream_closed.recv())
        .await
        .expect("the client gone, the upstream call ends");
    let second = tokio::time::timeout(10 * SECOND, second)
        .await
        .expect("the slot is free once the first client is gone")
        .unwrap()
        .unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(arrived(), 2);
}

/// A raw vendor that answers each whole request at once, and tells how
/// much of a body it had when the proxy closed a call mid-body.
async fn body_counting_vendor() -> (String, tokio::sync::mpsc::Receiver<usize>) {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", upstream.local_addr().unwrap());
    let (cut, upstream_cut) = tokio::sync::mpsc::channel::<usize>(4);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = upstream.accept().await.unwrap();
            let cut = cut.clone();
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buf = vec![0; 8192];
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        let _ = cut.send(read.len()).await;
                        return;
                    }
                    read.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&read);
                    // A request whose body is all here is answered.
                    let Some(head) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let length: usize = text[..head]
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length: "))
                        .map_or(0, |n| n.parse().unwrap());
                    if read.len() >= head + 4 + length {
                        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        stream.write_all(ok.as_bytes()).await.unwrap();
                        return;
                    }
                }
            });
        }
    });
    (base, upstream_cut)
}

/// A raw client of the proxy at `address` that sends `sent` bytes of a
/// body of `length`, then nothing (or ends it there, when `cut`): the
/// proxy's answer as the connection closed, and how long that took.
async fn stalled(address: &str, length: usize, sent: usize, cut: bool) -> (String, Duration) {
    let mut client = TcpStream::connect(address).await.unwrap();
    let head = format!("POST /up/x HTTP/1.1\r\nhost: a\r\ncontent-length: {length}\r\n\r\n");
    client.write_all(head.as_bytes()).await.unwrap();
    client.write_all(&vec![b'x'; sent]).await.unwrap();
    if cut {
        client.shutdown().await.unwrap();
    }
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(10 * SECOND, client.read_to_end(&mut answer))
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

/// A client that leaves its request body silent past the body read
/// timeout gets 408 and its connection closes, as nginx's
/// `client_body_timeout` answers: a body kept whole never reaches the
/// vendor; one streaming to it is cut there, so the vendor call ends and
/// frees its in-flight slot for the next client; a streaming body the
/// client ends early gets 400, as a kept one does. Real time: the timeout
/// is the proxy's clock, started as it reads (a moment before the client
/// starts its own), so the cut is held only to come late, not at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stalls_its_body_gets_408_and_frees_its_slot() {
    const IDLE: Duration = Duration::from_millis(300);
    let (base, mut upstream_cut) = body_counting_vendor().await;
    let proxy = proxy_of(one_in_flight(), "up", &base)
        .replay_body(1_000)
        .body_read_timeout(IDLE);
    let address = serve(proxy).await;

    let (answer, took) = stalled(&address, 100, 10, false).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_stalled"), "{answer}");
    assert!(took >= IDLE / 2, "cut after {took:?}, not at once");

    let (answer, took) = stalled(&address, 100_000, 5_000, false).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took >= IDLE / 2, "cut after {took:?}, not at once");
    let had = tokio::time::timeout(10 * SECOND, upstream_cut.recv())
        .await
        .expect("the vendor call ends")
        .unwrap();
    assert!(
        (5_000..100_000).contains(&had),
        "the vendor had {had} bytes"
    );
    let next = reqwest::Client::new()
        .post(format!("http://{address}/up/y"))
        .body("a whole body")
        .timeout(10 * SECOND)
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200, "the slot is free");
    assert!(
        upstream_cut.try_recv().is_err(),
        "only the stalled call was cut"
    );

    // A streaming body the client ends early is the client's fault too:
    // 400, as for a body kept whole, not the vendor's 502.
    let (answer, _) = stalled(&address, 100_000, 5_000, true).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("body_cut_off"), "{answer}");
}

/// A client that takes nothing of its answer for the send timeout is
/// disconnected, as nginx's `send_timeout` does, and its vendor call ends:
/// an answer is read from the vendor only as fast as the client takes it,
/// so with `max_in_flight(1)` a client that stops reading an endless
/// stream would otherwise hold the slot for good. Real time: the timeout
/// is the proxy's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off_and_frees_its_slot() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", upstream.local_addr().unwrap());
    let (closed, mut upstream_closed) = tokio::sync::mpsc::channel::<()>(4);
    // `/stream` sends 64 KiB chunks until the proxy closes the call; any
    // other path is answered at once.
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = upstream.accept().await.unwrap();
            let closed = closed.clone();
            tokio::spawn(async move {
                let mut request = vec![0; 4096];
                let n = stream.read(&mut request).await.unwrap();
                if !request[..n].starts_with(b"GET /stream") {
                    let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    stream.write_all(ok.as_bytes()).await.unwrap();
                    return;
                }
                let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                stream.write_all(head.as_bytes()).await.unwrap();
                let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
                while stream.write_all(chunk.as_bytes()).await.is_ok() {}
                let _ = closed.send(()).await;
            });
        }
    });
    let shaper = one_in_flight();
    let proxy = proxy_of(shaper, "up", &base).send_timeout(Duration::from_millis(300));
    let address = serve(proxy).await;

    // Asks for the stream, reads its head, then reads nothing more.
    let mut reader = TcpStream::connect(&address).await.unwrap();
    reader
        .write_all(b"GET /up/stream HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut head = vec![0; 1024];
    let n = reader.read(&mut head).await.unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
    tokio::time::timeout(30 * SECOND, upstream_closed.recv())
        .await
        .expect("the client cut off, its vendor call ends");
    let next = reqwest::Client::new()
        .get(format!("http://{address}/up/next"))
        .timeout(10 * SECOND)
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200, "the slot is free");
    // The cut client's connection is closed: what it did not read, then
    // its end.
    let mut rest = Vec::new();
    tokio::time::timeout(10 * SECOND, reader.read_to_end(&mut rest))
        .await
        .expect("the connection is closed")
        .ok();
}

/// Past `max_connections` the proxy accepts no client until one closes:
/// with two connections open and idle, a third client's request waits
/// (in the listener's backlog, unanswered), and is answered once one of
/// the two goes. Real time: "still waiting" can only pass late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_connections_the_proxy_takes_the_next_when_one_closes() {
    let server = answering_ok().await;
    let shaper = Shaper::builder().rate(100, SECOND).build().unwrap();
    let address = serve(proxy_of(shaper, "v", &server.uri()).max_connections(2)).await;
    let request = b"GET /v/x HTTP/1.1\r\nhost: a\r\n\r\n";
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut client = TcpStream::connect(&address).await.unwrap();
        client.write_all(request).await.unwrap();
        let mut answer = [0; 12];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 200");
        open.push(client);
    }
    let mut third = TcpStream::connect(&address).await.unwrap();
    third.write_all(request).await.unwrap();
    let mut answer = [0; 12];
    let early = tokio::time::timeout(Duration::from_millis(300), third.read_exact(&mut answer));
    assert!(early.await.is_err(), "answered past the cap");
    drop(open.pop());
    tokio::time::timeout(10 * SECOND, third.read_exact(&mut answer))
        .await
        .expect("answered once a connection closed")
        .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
}

/// A client that hangs up while its request waits in the lane takes the
/// request out: the vendor never gets it, and its turn goes to whoever
/// still waits. At 2 a second, six clients send at once; the first goes,
/// four of the waiting hang up, and the last is sent at the next turn
/// (half a second on), not after the four that left. Real time: the
/// bound on the last one's wait holds on a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_while_waiting_takes_its_request_out() {
    let server = answering_ok().await;
    let shaper = Shaper::builder().rate(2, SECOND).build().unwrap();
    let address = serve(proxy_of(shaper, "v", &server.uri())).await;
    let started = std::time::Instant::now();
    let mut clients = Vec::new();
    for i in 0..6 {
        let mut raw = TcpStream::connect(&address).await.unwrap();
        let request = format!("GET /v/{i} HTTP/1.1\r\nhost: a\r\n\r\n");
        raw.write_all(request.as_bytes()).await.unwrap();
        clients.push(raw);
        // In order: the lane serves them as they came.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut last = clients.pop().unwrap();
    drop(clients.split_off(1));
    let mut answer = [0; 12];
    tokio::time::timeout(10 * SECOND, last.read_exact(&mut answer))
        .await
        .expect("the last is answered")
        .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    let waited = started.elapsed();
    assert!(waited < 2 * SECOND, "the last waited {waited:?}");
    // Past the turns the four would have taken, had they stayed.
    tokio::time::sleep(3 * SECOND).await;
    let sent: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|request| request.url.path().to_owned())
        .collect();
    assert_eq!(sent, ["/0", "/5"]);
}

/// A vendor that answers `101 Switching Protocols` to a request that
/// asked for no upgrade (the proxy forwards none: `Upgrade` is
/// hop-by-hop) gets its client a 502 saying so, not a 101 that leaves the
/// client's connection in a protocol neither side speaks; the proxy goes
/// on serving the same client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vendor_that_switches_protocols_unasked_is_a_bad_gateway() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", upstream.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = upstream.accept().await.unwrap();
            tokio::spawn(async move {
                let mut request = vec![0; 4096];
                let n = stream.read(&mut request).await.unwrap();
                let answer: &[u8] = if request[..n].starts_with(b"GET /switch") {
                    b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"
                } else {
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                };
                stream.write_all(answer).await.unwrap();
            });
        }
    });
    let shaper = Shaper::builder().rate(100, SECOND).build().unwrap();
    let address = serve(proxy_of(shaper, "up", &base)).await;
    let client = reqwest::Client::new();
    let switched = client
        .get(format!("http://{address}/up/switch"))
        .send()
        .await
        .unwrap();
    assert_eq!(switched.status(), 502);
    assert_eq!(
        switched.headers()["x-callshaper-reason"],
        "vendor_switched_protocols"
    );
    let next = client
        .get(format!("http://{address}/up/next"))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200);
}
