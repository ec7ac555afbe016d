//! The shaper served as a reverse proxy, for the proxy's tests: served on
//! a free loopback port, and the shapers and vendors they start from.

use callshaper::Shaper;
use callshaper::proxy::{Proxy, ProxyBuilder};
use tokio::net::TcpListener;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::SECOND;

/// The proxy `builder` configures, served on a free loopback port; its
/// address.
pub async fn serve(builder: ProxyBuilder) -> String {
    let proxy = builder.build().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(proxy.serve(listener));
    address
}

/// `shaper` as a proxy of one upstream, `name` at `base`.
pub fn proxy_of(shaper: Shaper, name: &str, base: &str) -> ProxyBuilder {
    Proxy::builder(shaper).upstream(name, base)
}

/// A shaper far below its rate that lets one request be in flight at a
/// time: a test sees whether a call still holds the slot.
pub fn one_in_flight() -> Shaper {
    Shaper::builder()
        .rate(100, SECOND)
        .max_in_flight(1)
        .build()
        .unwrap()
}

/// A wiremock vendor answering 200 to everything.
pub async fn answering_ok() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    server
}
