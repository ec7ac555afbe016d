//! callshaper as a new user builds it: its default features and nothing
//! else. The main crate's own tests can't show this, since their
//! dev-dependencies switch on features a user may not have; `scripts/test`
//! runs this crate's tests on their own.

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    use callshaper::{Error, Shaper};

    fn shaper() -> Shaper {
        Shaper::builder()
            .rate(10, Duration::from_secs(1))
            .max_attempts(1)
            .build()
            .expect("the default client builds")
    }

    /// Every cause in an error's chain, outermost first.
    fn chain(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(" <- ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }

    /// The first two bytes of the first connection to `listener`; `None`
    /// when nobody connects (or writes) within 10 s.
    fn accept_and_read(listener: &TcpListener) -> Option<[u8; 2]> {
        let deadline = Instant::now() + Duration::from_secs(10);
        listener.set_nonblocking(true).ok()?;
        let mut stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => return None,
            }
        };
        stream.set_nonblocking(false).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        let mut record = [0u8; 2];
        stream.read_exact(&mut record).ok()?;
        Some(record)
    }

    /// The default client opens a TLS session: the first bytes it writes on
    /// the connection are a TLS handshake record (0x16, version 3.x).
    #[tokio::test]
    async fn an_https_call_starts_a_tls_handshake() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let first_bytes = std::thread::spawn(move || accept_and_read(&listener));
        let outcome = shaper()
            .get(format!("https://127.0.0.1:{port}/"))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        let record = first_bytes.join().expect("the listener thread");
        let record = record.unwrap_or_else(|| panic!("the client never connected: {outcome:?}"));
        assert_eq!(record, [0x16, 0x03], "a TLS handshake record");
        // The listener hung up mid-handshake: a transport error, not a panic.
        match outcome {
            Err(Error::Transport { .. }) => {}
            other => panic!("expected a transport error, got {other:?}"),
        }
    }

    /// A closed port: the call gets as far as connecting, and says so.
    #[tokio::test]
    async fn an_https_call_to_a_closed_port_is_a_connect_error() {
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
            listener.local_addr().expect("its address").port()
        };
        let outcome = shaper()
            .get(format!("https://127.0.0.1:{port}/"))
            .send()
            .await;
        let Err(Error::Transport { source, .. }) = outcome else {
            panic!("expected a transport error, got {outcome:?}");
        };
        let text = chain(&source);
        assert!(source.is_connect(), "not a connect error: {text}");
        assert!(
            !text.contains("scheme is not http"),
            "the client has no TLS: {text}"
        );
    }
}
