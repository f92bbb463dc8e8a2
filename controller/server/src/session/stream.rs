//! The live stream's loop: the agent's messages, the commands of the hub,
//! and the session's next deadline, until something ends it.

use baton_proto::wire;
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use super::{End, Shell, clocks, wire_io};
use baton_app::hub::SessionCmd;
use baton_app::link::Input;

impl Shell {
    pub(super) async fn serve<S>(
        &mut self,
        mut inbound: S,
        mut cmds: mpsc::Receiver<SessionCmd>,
        serial: Option<String>,
    ) -> End
    where
        S: Stream<Item = Result<wire::AgentMessage, Status>> + Unpin + Send,
    {
        let mut shutdown = self.shared.shutdown.clone();
        let mut revoked = self.shared.revoked.subscribe();
        if let Some(s) = &serial
            && revoked.borrow_and_update().contains(s)
        {
            return End::Revoked(s.clone());
        }
        let app = self.app.clone();
        loop {
            let wake = tokio::time::Instant::from_std(self.session.next_wake());
            // A feedback batch holds a place among those being converted
            // and stored at once until it is stored (see
            // `App::ingest_permit`).
            let mut permit = None;
            let input = tokio::select! {
                m = inbound.next() => match m {
                    Some(Ok(m)) => {
                        if matches!(&m.body, Some(wire::agent_message::Body::Feedback(b)) if !b.entries.is_empty()) {
                            permit = app.ingest_permit().await;
                        }
                        match wire_io::from_wire(m, &self.agent_id, &self.journal_id, self.held_cap) {
                            Ok(m) => Input::Agent(m),
                            Err(e) => return e,
                        }
                    }
                    None => return End::Closed,
                    Some(Err(s)) => return End::Transport(s),
                },
                c = cmds.recv() => match c {
                    Some(c) => Input::Hub(c),
                    None => return End::Shutdown,
                },
                _ = tokio::time::sleep_until(wake) => Input::Tick,
                _ = shutdown.changed() => return End::Shutdown,
                r = revoked.changed(), if serial.is_some() => match (r, &serial) {
                    (Ok(()), Some(s)) if revoked.borrow_and_update().contains(s) => {
                        return End::Revoked(s.clone());
                    }
                    // The sender lives as long as the shared state.
                    (Err(_), _) => return End::Shutdown,
                    _ => continue,
                },
            };
            let actions = self.session.handle(clocks(), input);
            if let Err(end) = self.perform(actions).await {
                return end;
            }
            drop(permit);
        }
    }
}
