//! The Link service agents dial: each stream admitted (identity, rate)
//! and handed to its session ([`crate::session`]).

use std::sync::Arc;

use baton_proto::wire;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::config::RETRY_AFTER_MS;
use crate::session;
use crate::shared::Shared;
use baton_pki::identity::Identity;

/// The Link service.
#[derive(Debug, Clone)]
pub struct LinkService {
    shared: Arc<Shared>,
}

impl LinkService {
    /// Serve over the controller's shared state.
    pub fn new(shared: Arc<Shared>) -> LinkService {
        LinkService { shared }
    }
}

#[tonic::async_trait]
impl wire::link_server::Link for LinkService {
    type ConnectStream = ReceiverStream<Result<wire::ControllerMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<wire::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let (who, serial) = self.shared.peer(request.extensions())?;
        let peer = match who {
            Identity::Agent { id, tenants } => session::LinkPeer {
                agent_id: Some(id),
                serial,
                tenants: Some(Identity::agent_tenants(&tenants)),
            },
            Identity::Insecure => session::LinkPeer::default(),
            Identity::Operator { .. } => {
                tracing::warn!("refused: {who} opened a link stream");
                return Err(Status::permission_denied(format!(
                    "{who}: an operator certificate cannot open a link stream"
                )));
            }
        };
        if let Some(bucket) = &self.shared.admit {
            let now = tokio::time::Instant::now().into_std();
            let admitted = bucket
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .admit(now);
            if let Err(slot) = admitted {
                self.shared.app.metrics.admit_refused();
                let ms = slot.as_millis().max(1);
                let mut status = Status::unavailable(format!(
                    "this controller admits new agent streams at a bounded rate: come back in {ms} ms"
                ));
                // The agent's link waits for its slot instead of a backoff.
                if let Ok(v) = ms.to_string().parse() {
                    status.metadata_mut().insert(RETRY_AFTER_MS, v);
                }
                return Err(status);
            }
        }
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(session::run(self.shared.clone(), inbound, tx, peer));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
