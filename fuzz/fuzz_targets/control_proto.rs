//! Arbitrary bytes as a control-socket line, read by both ends of the protocol
//! (`usnet_session::ctl::msg`): as a request the stack server would act on, and as
//! each answer a client reads. Whatever parses as a request must write and read
//! back equal; the geometry the server grants for an attach stays within its caps;
//! and a `stat` answer merges with itself (a sharded server's sum) without
//! overflowing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use usnet_session::ctl::msg::{AttachReply, Clients, Done, PinReply, PingEvent, Request, Stat};
use usnet_session::ctl::{parse_answer, request_line};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = serde_json::from_slice::<Request>(data) {
        let line = request_line(&req);
        let back: Request = serde_json::from_str(&line).expect("a written request reads back");
        assert_eq!(back, req);
        if let Request::Attach(a) = &req {
            let cap = usnet_session_abi::Geometry {
                max_sockets: 4096,
                ring_bytes: 1 << 22,
                ..Default::default()
            };
            let (g, _) = usnet_server::control::granted_geometry(a, cap);
            assert!(g.max_sockets >= 1 && g.max_sockets <= cap.max_sockets);
            assert!(g.ring_bytes.is_power_of_two() && g.ring_bytes >= 4096);
            assert!(g.ring_bytes <= cap.ring_bytes);
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_answer::<AttachReply>(text);
    let _ = parse_answer::<PinReply>(text);
    let _ = parse_answer::<PingEvent>(text);
    let _ = parse_answer::<Clients>(text);
    let _ = parse_answer::<Done>(text);
    if let Ok(s) = parse_answer::<Stat>(text) {
        let all = Stat::merge(vec![s.clone(), s], 16).expect("two parts merge");
        assert_eq!(all.shards.len(), 2);
    }
});
