//! A fake controller for the link's tests: a tonic `LinkServer` on
//! 127.0.0.1:0, on a runtime of its own, that reports what each stream
//! says through a channel and lets the test speak on each stream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use baton_proto::wire::link_server::{Link, LinkServer};
use baton_proto::wire::{AgentMessage, ControllerMessage};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

pub type ToAgent = tokio::sync::mpsc::Sender<Result<ControllerMessage, Status>>;

/// What the fake controller saw.
pub enum Ev {
    /// An agent opened stream `stream`; `tx` talks to it (drop it to close
    /// the stream from the controller's side).
    Opened { stream: u64, tx: ToAgent },
    /// A message on a stream.
    Msg { stream: u64, msg: Box<AgentMessage> },
    /// The agent's side of a stream ended.
    Closed { stream: u64 },
    /// A stream was refused RESOURCE_EXHAUSTED.
    Exhausted,
}

struct Svc {
    events: Sender<Ev>,
    refuse: Arc<AtomicBool>,
    /// Refuse streams as a replica admitting sessions at a bounded rate
    /// does (RESOURCE_EXHAUSTED).
    exhausted: Arc<AtomicBool>,
    /// Stop reading the agents' streams (HTTP/2 flow control then holds
    /// the agent back).
    deaf: Arc<AtomicBool>,
    next: AtomicU64,
}

#[tonic::async_trait]
impl Link for Svc {
    type ConnectStream = ReceiverStream<Result<ControllerMessage, Status>>;

    async fn connect(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        if self.refuse.load(Ordering::Acquire) {
            return Err(Status::unavailable("test: refusing streams"));
        }
        if self.exhausted.load(Ordering::Acquire) {
            let _ = self.events.send(Ev::Exhausted);
            return Err(Status::resource_exhausted(
                "test: admitting no more sessions",
            ));
        }
        let stream = self.next.fetch_add(1, Ordering::AcqRel) + 1;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let _ = self.events.send(Ev::Opened { stream, tx });
        let mut inbound = req.into_inner();
        let events = self.events.clone();
        let deaf = self.deaf.clone();
        tokio::spawn(async move {
            loop {
                while deaf.load(Ordering::Acquire) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let Ok(Some(msg)) = inbound.message().await else {
                    break;
                };
                let _ = events.send(Ev::Msg {
                    stream,
                    msg: Box::new(msg),
                });
            }
            let _ = events.send(Ev::Closed { stream });
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The fake controller: a server on its own runtime.
pub struct Fake {
    pub addr: SocketAddr,
    pub events: Receiver<Ev>,
    pub refuse: Arc<AtomicBool>,
    pub exhausted: Arc<AtomicBool>,
    pub deaf: Arc<AtomicBool>,
    pub _rt: tokio::runtime::Runtime,
}

pub fn fake() -> Fake {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, events) = std::sync::mpsc::channel();
    let refuse = Arc::new(AtomicBool::new(false));
    let exhausted = Arc::new(AtomicBool::new(false));
    let deaf = Arc::new(AtomicBool::new(false));
    let svc = Svc {
        events: tx,
        refuse: refuse.clone(),
        exhausted: exhausted.clone(),
        deaf: deaf.clone(),
        next: AtomicU64::new(0),
    };
    rt.spawn(
        tonic::transport::Server::builder()
            // Small HTTP/2 windows: a deaf controller holds the agent back
            // after a few kilobytes.
            .initial_stream_window_size(16 * 1024)
            .initial_connection_window_size(16 * 1024)
            .add_service(LinkServer::new(svc))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    Fake {
        addr,
        events,
        refuse,
        exhausted,
        deaf,
        _rt: rt,
    }
}
