//! The operators' API over gRPC: each call takes its caller from the
//! connection, maps the request onto an operation of [`baton_app`], and
//! the answer (or [`AppError`]) back onto the wire. No rule lives here.
//! Changes (push, cancel, label, grant, forget), refused ones included,
//! are audited before the answer.

use std::pin::Pin;
use std::sync::Arc;

use baton_proto::wire::{self, watch_event::Body as Ev};
use tokio::sync::broadcast;
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use super::convert;
use super::convert::status;
use crate::shared::Shared;
use baton_app::agents::{AgentView, LabelChange};
use baton_app::events::{self, AgentEventKind, Event, WatchFilter};
use baton_app::feedback::FeedbackQuery;
use baton_app::{App, AppError, Caller};
use baton_model::LabelOverrides;
use baton_model::{RefTime, SpanNanos};

/// The Admin service.
#[derive(Debug, Clone)]
pub struct AdminService {
    shared: Arc<Shared>,
}

/// Most clock reports one answer carries (a report every 5 s: about 14
/// hours of one agent).
const CLOCK_HISTORY_CAP: u32 = 10_000;

impl AdminService {
    /// Serve over the controller's shared state.
    pub fn new(shared: Arc<Shared>) -> AdminService {
        AdminService { shared }
    }

    fn app(&self) -> &Arc<App> {
        &self.shared.app
    }

    fn caller(&self, ext: &tonic::Extensions) -> Result<(Caller, Option<String>), Status> {
        let (who, serial) = self.shared.operator(ext)?;
        Ok((Caller::new(who), serial))
    }
}

fn nonempty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn agent_summary(v: AgentView) -> wire::AgentSummary {
    let held: Vec<baton_model::HeldPackRow> = v
        .packs
        .iter()
        .filter_map(|d| {
            d.held.map(|h| baton_model::HeldPackRow {
                tenant: d.tenant.clone(),
                pack: d.pack.clone(),
                version: h.version,
                stopped: h.stopped,
            })
        })
        .collect();
    let a = v.agent;
    wire::AgentSummary {
        connected: v.connected,
        lateness_p99_ns: v.lateness_p99.nanos(),
        labels: a.labels.into_iter().collect(),
        agent_version: a.agent_version,
        last_seen_ns: a.last_seen.as_nanos(),
        clock: a.clock.as_ref().map(convert::clock_to_wire),
        trust: a.trust.map(convert::trust_to_wire),
        update: a.update.as_ref().map(convert::update_to_wire),
        arch: a.arch,
        packs: convert::held_to_wire(&held),
        tenants: a.tenants.into_iter().collect(),
        conflict: v
            .conflict
            .map(|c| {
                format!(
                    "{} stream{} from another journal ({}) refused while journal {} holds the id; last {}",
                    c.refused,
                    if c.refused == 1 { "" } else { "s" },
                    c.refused_journal,
                    c.holder_journal,
                    c.at
                )
            })
            .unwrap_or_default(),
        deliveries: v
            .packs
            .iter()
            .filter(|d| d.state != baton_model::DeliveryState::Local)
            .map(convert::delivery_to_wire)
            .collect(),
        id: a.id,
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Every call first takes its caller (an agent certificate is refused),
/// then hands the request to the application.
#[tonic::async_trait]
impl wire::admin_server::Admin for AdminService {
    async fn push(
        &self,
        request: Request<wire::PushRequest>,
    ) -> Result<Response<wire::PushReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let source = nonempty(&req.source_name).unwrap_or_else(|| "pack".to_string());
        let p = self
            .app()
            .push_as(&caller, req.yaml, &source)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::PushReply {
            pack: Some(convert::wire_ref(&p.key.tenant, &p.key.pack, p.version)),
            unchanged: p.unchanged,
            agents: p.agents,
            rollout: p.rollout,
        }))
    }

    async fn cancel(
        &self,
        request: Request<wire::CancelRequest>,
    ) -> Result<Response<wire::CancelReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let c = self
            .app()
            .cancel_as(&caller, &req.tenant, &req.pack, &req.agents)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::CancelReply {
            pack: Some(convert::wire_ref(&c.key.tenant, &c.key.pack, c.version)),
            agents: c.agents,
        }))
    }

    async fn list_packs(
        &self,
        request: Request<wire::ListPacksRequest>,
    ) -> Result<Response<wire::ListPacksReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let packs = match self.app().packs(&caller, &req.tenant).await {
            Ok(p) => p,
            // Another tenant's packs: as if there were none.
            Err(AppError::NotFound(_)) => Vec::new(),
            Err(e) => return Err(status(e)),
        };
        Ok(Response::new(wire::ListPacksReply {
            packs: packs
                .into_iter()
                .map(|p| wire::PackSummary {
                    pack: Some(convert::wire_ref(&p.tenant, &p.pack, p.latest)),
                    targets: p.targets.to_string(),
                    pushed_ns: p.pushed.as_nanos(),
                    cancelled: p.cancelled.is_some(),
                    acked: p.acked,
                    nacked: p.nacked,
                    pending: p.pending,
                    ahead: p.ahead,
                })
                .collect(),
        }))
    }

    async fn list_agents(
        &self,
        request: Request<wire::ListAgentsRequest>,
    ) -> Result<Response<wire::ListAgentsReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let page = self
            .app()
            .agents(&caller, nonempty(&req.after), req.limit)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::ListAgentsReply {
            agents: page.agents.into_iter().map(agent_summary).collect(),
            next: page.next.unwrap_or_default(),
        }))
    }

    async fn deliveries(
        &self,
        request: Request<wire::DeliveriesRequest>,
    ) -> Result<Response<wire::DeliveriesReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let page = self
            .app()
            .deliveries(
                &caller,
                &req.tenant,
                &req.pack,
                req.version,
                nonempty(&req.after).as_deref(),
                req.limit,
            )
            .await
            .map_err(status)?;
        Ok(Response::new(wire::DeliveriesReply {
            pack: Some(convert::wire_ref(
                &page.key.tenant,
                &page.key.pack,
                page.version,
            )),
            deliveries: page.rows.iter().map(convert::delivery_to_wire).collect(),
            next: page.next.unwrap_or_default(),
        }))
    }

    type QueryFeedbackStream = BoxStream<wire::FeedbackRecord>;

    async fn query_feedback(
        &self,
        request: Request<wire::FeedbackQuery>,
    ) -> Result<Response<Self::QueryFeedbackStream>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let rows = self.app().feedback(
            &caller,
            FeedbackQuery {
                tenant: req.tenant,
                pack: nonempty(&req.pack),
                agent_id: nonempty(&req.agent_id),
                since: (req.since_ns != 0).then_some(RefTime::from_nanos(req.since_ns)),
                limit: u64::from(req.limit),
            },
        );
        let out = tokio_stream::StreamExt::map(ReceiverStream::new(rows), |r| {
            r.map(|row| convert::feedback_to_wire(&row)).map_err(status)
        });
        Ok(Response::new(Box::pin(out)))
    }

    type WatchStream = BoxStream<wire::WatchEvent>;

    async fn watch(
        &self,
        request: Request<wire::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (caller, serial) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let filter = WatchFilter {
            tenant: match caller.tenant() {
                None => nonempty(&req.tenant),
                Some(own) => {
                    if !req.tenant.is_empty() && req.tenant != own {
                        return Err(Status::not_found(format!("no tenant {}", req.tenant)));
                    }
                    Some(own.to_string())
                }
            },
            pack: nonempty(&req.pack),
        };
        let binding = self.app().cfg.binding;
        let mut rx = self.app().subscribe();
        // A watcher whose certificate is revoked is cut off within seconds.
        let mut revoked = self.shared.revoked.subscribe();
        revoked.mark_changed();
        let mut shutdown = self.shared.shutdown.clone();
        let (tx, out) = tokio::sync::mpsc::channel(256);
        // One task per watcher: forwards what it may see until the watcher
        // goes away or the controller stops. A watcher slower than the
        // events is told how many it missed, never blocks the streams.
        tokio::spawn(async move {
            loop {
                let ev = tokio::select! {
                    r = rx.recv() => match r {
                        Ok(ev) => {
                            if !events::visible(&ev, &filter, binding) {
                                continue;
                            }
                            let Some(w) = event_to_wire(ev) else { continue };
                            w
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => wire::WatchEvent {
                            body: Some(Ev::Lagged(n)),
                        },
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = shutdown.changed() => return,
                    _ = tx.closed() => return,
                    r = revoked.changed(), if serial.is_some() => {
                        if r.is_err() {
                            return;
                        }
                        let hit = serial
                            .as_ref()
                            .filter(|s| revoked.borrow_and_update().contains(*s));
                        match hit {
                            Some(s) => {
                                tracing::warn!(serial = %s, "watch of a revoked certificate closed");
                                let _ = tx
                                    .send(Err(Status::permission_denied(format!(
                                        "certificate {s} is revoked"
                                    ))))
                                    .await;
                                return;
                            }
                            None => continue,
                        }
                    }
                };
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    async fn clock_history(
        &self,
        request: Request<wire::ClockHistoryRequest>,
    ) -> Result<Response<wire::ClockHistoryReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let limit = match req.limit {
            0 => CLOCK_HISTORY_CAP,
            n => n.min(CLOCK_HISTORY_CAP),
        };
        let rows = self
            .app()
            .clock_history(
                &caller,
                &req.agent,
                RefTime::from_nanos(req.since_ns),
                limit,
            )
            .await
            .map_err(status)?;
        Ok(Response::new(wire::ClockHistoryReply {
            reports: rows.iter().map(convert::clock_to_wire).collect(),
        }))
    }

    async fn audit(
        &self,
        request: Request<wire::AuditQuery>,
    ) -> Result<Response<wire::AuditReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let rows = self
            .app()
            .audit(&caller, RefTime::from_nanos(req.since_ns), req.limit)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::AuditReply {
            records: rows
                .into_iter()
                .map(|r| wire::AuditRecord {
                    at_ns: r.at.as_nanos(),
                    who: r.who,
                    tenant: r.tenant,
                    role: r.role,
                    action: r.action,
                    target: r.target,
                    result: r.result,
                })
                .collect(),
        }))
    }

    async fn label_agent(
        &self,
        request: Request<wire::LabelAgentRequest>,
    ) -> Result<Response<wire::LabelAgentReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let named = caller.audit_tenant(&req.tenant);
        let mut what: Vec<String> = req.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
        what.sort();
        what.extend(req.remove.iter().map(|k| format!("-{k}")));
        what.extend(req.reset.iter().map(|k| format!("reset {k}")));
        let target = format!("agent {}: {}", req.agent_id, what.join(" "));
        let r = match label_change(&req) {
            Ok(change) => {
                self.app()
                    .label(&caller, &req.agent_id, &req.tenant, change)
                    .await
            }
            Err(e) => Err(e),
        };
        let l = self
            .app()
            .audited(&caller, &named, "label", &target, r)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::LabelAgentReply {
            agent_id: l.agent_id,
            labels: l.labels.into_iter().collect(),
            agent_labels: l.agent_labels.into_iter().collect(),
            tenant: l.tenant,
        }))
    }

    async fn forget_agent(
        &self,
        request: Request<wire::ForgetAgentRequest>,
    ) -> Result<Response<wire::ForgetAgentReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let named = caller.audit_tenant(&req.tenant);
        let id = req.agent_id.clone();
        let r = self.app().forget(&caller, &id, &req.tenant).await;
        let target = match &r {
            Ok(f) if f.record_deleted => format!("agent {id} (whole record)"),
            Ok(_) => format!("agent {id} (this tenant's deliveries and labels)"),
            Err(_) => format!("agent {id}"),
        };
        let f = self
            .app()
            .audited(&caller, &named, "forget", &target, r)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::ForgetAgentReply {
            agent_id: id,
            record_deleted: f.record_deleted,
            disconnected: f.disconnected,
        }))
    }

    async fn rollout(
        &self,
        request: Request<wire::RolloutRequest>,
    ) -> Result<Response<wire::RolloutReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let reply = super::rollouts::rollout(self.app(), &caller, request.into_inner()).await?;
        Ok(Response::new(reply))
    }

    async fn upload_release(
        &self,
        request: Request<tonic::Streaming<wire::ReleaseUploadPart>>,
    ) -> Result<Response<wire::ReleaseInfo>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let info = super::releases::upload(self.app(), &caller, request.into_inner()).await?;
        Ok(Response::new(info))
    }

    async fn list_releases(
        &self,
        request: Request<wire::ListReleasesRequest>,
    ) -> Result<Response<wire::ListReleasesReply>, Status> {
        let _ = self.caller(request.extensions())?;
        let rows = self.app().releases().await.map_err(status)?;
        Ok(Response::new(wire::ListReleasesReply {
            releases: rows.iter().map(super::releases::release_info).collect(),
        }))
    }

    async fn agent_update(
        &self,
        request: Request<wire::AgentUpdateRequest>,
    ) -> Result<Response<wire::AgentUpdateReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let reply =
            super::releases::agent_update(self.app(), &caller, request.into_inner()).await?;
        Ok(Response::new(reply))
    }

    async fn grant_agent(
        &self,
        request: Request<wire::GrantAgentRequest>,
    ) -> Result<Response<wire::GrantAgentReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let tenants = self
            .app()
            .grant_as(&caller, &req.agent_id, &req.tenant, !req.revoke)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::GrantAgentReply {
            agent_id: req.agent_id,
            tenants,
        }))
    }
}

/// A label request as a change, every key checked.
fn label_change(req: &wire::LabelAgentRequest) -> Result<LabelChange, AppError> {
    let bad = |e: convert::BadMessage| AppError::Invalid(e.0);
    convert::check_ident("agent id", &req.agent_id).map_err(bad)?;
    let mut set: LabelOverrides = convert::labels(&req.set)
        .map_err(bad)?
        .into_iter()
        .map(|(k, v)| (k, Some(v)))
        .collect();
    for k in req.remove.iter().chain(&req.reset) {
        convert::label_key(k).map_err(bad)?;
        if set.contains_key(k) {
            return Err(AppError::Invalid(format!(
                "label {k:?} is both set and removed or reset"
            )));
        }
    }
    for k in &req.remove {
        set.insert(k.clone(), None);
    }
    Ok(LabelChange {
        set,
        reset: req.reset.clone(),
    })
}

/// A domain event as the wire says it (`None`: the wire has no word for
/// it; an operator's action reaches a watcher as the rows it changed).
fn event_to_wire(e: Event) -> Option<wire::WatchEvent> {
    let body = match e {
        Event::Action(_) => return None,
        Event::Feedback(f) => Ev::Feedback(convert::feedback_to_wire(&f)),
        Event::Delivery(d) => Ev::Delivery(convert::delivery_to_wire(&d)),
        Event::Agent(a) => Ev::Agent(wire::AgentEvent {
            agent_id: a.agent_id,
            kind: match a.kind {
                AgentEventKind::Connected => wire::AgentEventKind::Connected,
                AgentEventKind::Disconnected => wire::AgentEventKind::Disconnected,
                AgentEventKind::Clock => wire::AgentEventKind::Clock,
                AgentEventKind::Conflict => wire::AgentEventKind::Conflict,
            } as i32,
            clock: a.clock.as_ref().map(convert::clock_to_wire),
            detail: a.detail,
            at_ns: a.at.as_nanos(),
        }),
    };
    Some(wire::WatchEvent { body: Some(body) })
}
