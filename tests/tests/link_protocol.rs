//! The Link protocol spoken by hand against the real controller: what a
//! broken or hostile peer sends (no hello, a second hello, feedback out of
//! order, an oversized message, raw garbage on the port) closes that
//! stream with a clear status, and the controller keeps serving the
//! others. Feedback re-sent after a lost ack is stored once. A flood of
//! time requests and clock reports is answered and stored only at an
//! agent's rate.

use std::io::Write;
use std::time::Duration;

use baton_e2e::fleet::start_controller;
use baton_proto::wire::{
    self, agent_message::Body as In, controller_message::Body as Out, link_client::LinkClient,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

struct Peer {
    tx: mpsc::Sender<wire::AgentMessage>,
    rx: Streaming<wire::ControllerMessage>,
}

async fn open(url: &str) -> Peer {
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut client = LinkClient::new(channel).max_encoding_message_size(64 * 1024 * 1024);
    let (tx, rx) = mpsc::channel(16);
    let rx = client
        .connect(ReceiverStream::new(rx))
        .await
        .expect("open stream")
        .into_inner();
    Peer { tx, rx }
}

fn msg(body: In) -> wire::AgentMessage {
    wire::AgentMessage { body: Some(body) }
}

/// A hello that declares the pack its feedback is about (an agent's
/// feedback is stored only for packs it holds or was sent).
fn hello(id: &str) -> wire::AgentMessage {
    msg(In::Hello(wire::Hello {
        agent_id: id.into(),
        journal_id: format!("journal-of-{id}"),
        agent_version: "test".into(),
        packs: vec![wire::HeldPack {
            pack: Some(wire::PackRef {
                tenant: "default".into(),
                pack: "p".into(),
                version: 1,
            }),
            stopped: false,
        }],
        ..Default::default()
    }))
}

fn entry(seq: u64) -> wire::Feedback {
    wire::Feedback {
        seq,
        execution_id: format!("default/p/v1/i/{seq}/a1"),
        pack: Some(wire::PackRef {
            tenant: "default".into(),
            pack: "p".into(),
            version: 1,
        }),
        instruction: "i".into(),
        attempt: 1,
        outcome: wire::Outcome::Ok as i32,
        event: "executed".into(),
        ..Default::default()
    }
}

fn batch(seqs: &[u64]) -> wire::AgentMessage {
    msg(In::Feedback(wire::FeedbackBatch {
        entries: seqs.iter().map(|s| entry(*s)).collect(),
    }))
}

/// The next message that is not a ping, or the stream's error.
async fn next(p: &mut Peer) -> Result<Option<Out>, tonic::Status> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(15), p.rx.message())
            .await
            .expect("an answer within 15 s")?;
        match m.and_then(|m| m.body) {
            Some(Out::Ping(_)) => continue,
            other => return Ok(other),
        }
    }
}

async fn welcomed(url: &str, id: &str) -> (Peer, u64) {
    let mut p = open(url).await;
    p.tx.send(hello(id)).await.expect("send hello");
    match next(&mut p).await {
        Ok(Some(Out::Welcome(w))) => (p, w.feedback_acked_seq),
        other => panic!("expected welcome, got {other:?}"),
    }
}

async fn acked(p: &mut Peer) -> u64 {
    match next(p).await {
        Ok(Some(Out::FeedbackAck(a))) => a.seq,
        other => panic!("expected a feedback ack, got {other:?}"),
    }
}

fn code_of(r: Result<Option<Out>, tonic::Status>) -> tonic::Code {
    match r {
        Err(s) => s.code(),
        Ok(m) => panic!("expected the stream to be closed, got {m:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn violations_close_only_the_offending_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");

    // A well-behaved agent, open during all of it.
    let (mut good, acked0) = welcomed(&c.url, "good").await;
    assert_eq!(acked0, 0);
    good.tx.send(batch(&[1, 2, 3])).await.expect("send");
    assert_eq!(acked(&mut good).await, 3);

    // No hello first.
    let mut p = open(&c.url).await;
    p.tx.send(batch(&[1])).await.expect("send");
    assert_eq!(code_of(next(&mut p).await), tonic::Code::InvalidArgument);

    // A bad agent id.
    let mut p = open(&c.url).await;
    p.tx.send(hello("../etc/passwd")).await.expect("send");
    assert_eq!(code_of(next(&mut p).await), tonic::Code::InvalidArgument);

    // A second hello.
    let (mut p, _) = welcomed(&c.url, "twice").await;
    p.tx.send(hello("twice")).await.expect("send");
    assert_eq!(code_of(next(&mut p).await), tonic::Code::InvalidArgument);

    // Feedback out of order within the new part.
    let (mut p, _) = welcomed(&c.url, "order").await;
    p.tx.send(batch(&[5, 4])).await.expect("send");
    assert_eq!(code_of(next(&mut p).await), tonic::Code::InvalidArgument);

    // An oversized message (over the 16 MiB limit).
    let (mut p, _) = welcomed(&c.url, "big").await;
    let mut e = entry(1);
    e.detail = "x".repeat(17 * 1024 * 1024);
    let _ =
        p.tx.send(msg(In::Feedback(wire::FeedbackBatch { entries: vec![e] })))
            .await;
    let code = code_of(next(&mut p).await);
    assert!(
        matches!(
            code,
            tonic::Code::ResourceExhausted | tonic::Code::Internal | tonic::Code::OutOfRange
        ),
        "{code:?}"
    );

    // Raw garbage on the port.
    let mut s = std::net::TcpStream::connect(&c.addr).expect("tcp");
    let _ = s.write_all(&[0xde; 4096]);
    drop(s);

    // The good stream still works.
    good.tx.send(batch(&[4])).await.expect("send");
    assert_eq!(acked(&mut good).await, 4);
}

#[tokio::test(flavor = "current_thread")]
async fn resent_feedback_is_stored_once_and_a_new_stream_replaces_the_old() {
    let dir = tempfile::tempdir().expect("tempdir");

    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let (mut p, _) = welcomed(&c.url, "r1").await;
    p.tx.send(batch(&[1, 2])).await.expect("send");
    assert_eq!(acked(&mut p).await, 2);

    // A new stream for the same agent: the old one is closed.
    let (mut q, acked_seq) = welcomed(&c.url, "r1").await;
    assert_eq!(acked_seq, 2, "welcome says what is stored");
    assert_eq!(code_of(next(&mut p).await), tonic::Code::Aborted);
    // Re-send of 1..2 (ack lost) plus new 3: stored once each.
    q.tx.send(batch(&[1, 2, 3])).await.expect("send");
    assert_eq!(acked(&mut q).await, 3);
    drop(q);

    let rows = c.feedback("p");
    let seqs: Vec<u64> = rows.iter().filter_map(|r| r["seq"].as_u64()).collect();
    assert_eq!(seqs, [1, 2, 3], "{rows:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn health_and_reflection_are_served() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let channel = tonic::transport::Endpoint::from_shared(c.url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel.clone());
    for service in ["baton.v1.Link", "baton.v1.Admin"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check")
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service}");
    }
    let mut reflection = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .expect("reflection")
        .into_inner();
    let r = answers
        .message()
        .await
        .expect("answer")
        .expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = r.message_response else {
        panic!("expected a service list, got {r:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for want in ["baton.v1.Link", "baton.v1.Admin"] {
        assert!(names.contains(&want), "{names:?}");
    }
}

/// A hostile agent's flood of time requests and clock reports: the
/// controller answers and stores only what an agent could send (a burst,
/// then a rate), drops the rest, and keeps serving that stream.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_time_requests_and_clock_reports_is_limited_and_the_stream_lives_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_controller(&dir.path().join("ctl"), "127.0.0.1:0");
    let (mut p, _) = welcomed(&c.url, "flood").await;
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as i64;
    let t0 = std::time::Instant::now();
    for i in 0..200 {
        let r = wire::TimeExchangeRequest { id: i, t1_ns: 1 };
        p.tx.send(msg(In::TimeRequest(r))).await.expect("send");
    }
    for i in 0..50 {
        let r = wire::ClockReport {
            source: wire::ClockSource::Link as i32,
            state: wire::ClockState::Locked as i32,
            offset_ns: i,
            uncertainty_ns: 1_000,
            at_ns: now_ns + i,
            ..Default::default()
        };
        p.tx.send(msg(In::ClockReport(r))).await.expect("send");
    }
    // Handled in order: every reply the flood earns comes before this ack.
    p.tx.send(batch(&[1])).await.expect("send");
    let mut replies = 0;
    loop {
        match next(&mut p).await {
            Ok(Some(Out::TimeReply(_))) => replies += 1,
            Ok(Some(Out::FeedbackAck(a))) => {
                assert_eq!(a.seq, 1);
                break;
            }
            other => panic!("expected time replies then an ack, got {other:?}"),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    // Burst 16, then 8 a second (controller/app/src/link/mod.rs, `TIME_REQUESTS`).
    assert!(
        replies >= 16 && f64::from(replies) <= 17.0 + 8.0 * secs,
        "{replies} of 200 time requests answered in {secs:.2} s"
    );
    // Burst 4, then one every 2 s: the rest were not stored.
    let o = c.ctl(&["clock", "flood", "--json"]);
    assert!(
        o.status.success(),
        "clock: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stored = baton_e2e::fleet::json_lines(&o.stdout).len();
    assert!(
        (4..=5 + (secs / 2.0) as usize).contains(&stored),
        "{stored} of 50 clock reports stored in {secs:.2} s"
    );
    // The stream still serves.
    p.tx.send(batch(&[2])).await.expect("send");
    assert_eq!(acked(&mut p).await, 2);
    assert!(
        c.log().contains("faster than an agent does"),
        "the drop is logged"
    );
}
