//! HTTP/1.1 for usnet, in one place for the server and the client:
//!
//! - [`message`]: request and response heads, parsed strictly (nothing from the wire
//!   trusted, every refusal with its status code);
//! - [`body`]: where a body ends (length, chunked, until close) and the chunked
//!   decoder;
//! - [`server`]: the built-in service (`usnet up --services http`), run inside a
//!   stack's poll loop;
//! - [`client`]: URLs, requests and reading a response, for `usnet get` and
//!   `usnet demo`;
//! - [`pattern`]: the body of `/bytes/N`, which both ends know.
//!
//! The server needs only a sans-IO [`usnet_stack::Stack`]; the client any
//! `Read + Write` stream. Neither depends on the runtime, which registers the service.

pub mod body;
pub mod client;
pub mod message;
pub mod pattern;
pub mod server;

pub use body::{BodyDecoder, ChunkedDecoder};
pub use client::{exchange, parse_url, read_response, BodyFill, Fetched, Url};
pub use message::{parse_request, parse_response, HttpError, RequestHead, ResponseHead};
pub use pattern::{
    check_pattern, fill_pattern, pattern_byte, pattern_slice, PATTERN_CHUNK, PATTERN_PERIOD,
};
pub use server::{HttpConfig, HttpService, DEFAULT_PORT};

/// Lowercase hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
