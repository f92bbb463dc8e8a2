//! Everything decoded from the wire: arbitrary bytes as an agent's message
//! (what the controller decodes and checks, and the typed feedback record
//! it carries), as a controller's message (what the agent decodes; a
//! push's YAML goes through the pack parser), and as a record of the
//! agent's feedback outbox (binary or an older agent's JSON). Nothing may
//! panic; bad input is an error that closes one stream.
#![no_main]

use baton_server::convert;
use baton_proto::wire::{self, agent_message::Body as In, controller_message::Body as Out};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = wire::AgentMessage::decode(data) {
        match m.body {
            Some(In::Hello(h)) => {
                let _ = convert::hello(&h, 1024, 0);
            }
            Some(In::Feedback(b)) => {
                for e in &b.entries {
                    if let Ok(row) = convert::feedback("a", "j", e, 0) {
                        let _ = convert::feedback_to_wire(&row);
                    }
                    if let Ok(r) = baton_proto::feedback::Record::from_wire(e) {
                        let _ = r.to_wire(e.seq, e.dropped_before);
                    }
                }
            }
            Some(In::ClockReport(c)) => {
                if let Ok(row) = convert::clock(&c) {
                    let _ = convert::clock_to_wire(&row);
                }
            }
            Some(In::Held(h)) => {
                let _ = convert::held(&h.packs, 1024);
            }
            Some(In::PackNack(n)) => {
                let _ = convert::pack_ref(n.pack.as_ref());
                let _ = convert::nack_errors(&n.errors);
            }
            Some(In::PackAck(a)) => {
                let _ = convert::pack_ref(a.pack.as_ref());
            }
            _ => {}
        }
    }
    let _ = baton_agent::outbox::decode(data);
    if let Ok(m) = wire::ControllerMessage::decode(data)
        && let Some(Out::PackPush(p)) = m.body
    {
        let _ = baton_proto::pack::parse_pack(&p.yaml);
    }
});
