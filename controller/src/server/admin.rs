//! The operators' API. A push is validated with the agent's own code,
//! stored, then delivered; the answer comes only once it is stored, so an
//! operator who saw "pushed" can rely on it surviving a controller crash.
//!
//! Every call starts with the caller ([`Caller`]): its tenant confines what
//! it sees, its role what it may change; pushes, cancels, label changes and
//! forgets, refused ones included, go to the audit log before the answer.

use std::pin::Pin;
use std::sync::Arc;

use baton_proto::RefTime;
use baton_proto::pack::parse_pack;
use baton_proto::wire::{self, watch_event::Body as Ev};
use tokio::sync::broadcast;
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use super::access::{Caller, used_by_other_tenant};
use super::convert;
use super::hub::SessionCmd;
use super::session::holders;
use super::{Shared, now_ns};
use crate::store::{
    AgentRow, AuditRow, DeliveryRow, DeliveryState, FeedbackFilter, LabelOverrides, PackVersionRow,
    PutPack, StoreError,
};

/// The Admin service.
#[derive(Debug, Clone)]
pub struct AdminService {
    shared: Arc<Shared>,
}

/// Most clock reports one answer carries (a report every 5 s: about 14
/// hours of one agent).
const CLOCK_HISTORY_CAP: usize = 10_000;

impl AdminService {
    /// Serve over the controller's shared state.
    pub fn new(shared: Arc<Shared>) -> AdminService {
        AdminService { shared }
    }

    fn caller(&self, ext: &tonic::Extensions) -> Result<(Caller, Option<String>), Status> {
        let (who, serial) = self.shared.operator(ext)?;
        Ok((Caller { who }, serial))
    }

    /// Record an action and its result; a failed audit write fails the
    /// call (an action that cannot be audited is not answered as done).
    async fn record<T>(
        &self,
        caller: &Caller,
        tenant: &str,
        action: &str,
        target: &str,
        result: Result<T, Status>,
    ) -> Result<T, Status> {
        let (who, tenant, role) = caller.audit_fields(tenant);
        let row = AuditRow {
            at_ns: now_ns(),
            who,
            tenant,
            role,
            action: action.into(),
            target: target.into(),
            result: match &result {
                Ok(_) => "ok".into(),
                Err(s) => format!("{:?}: {}", s.code(), s.message()),
            },
        };
        self.shared
            .store
            .put_audit(row)
            .await
            .map_err(store_status)?;
        result
    }

    async fn do_push(
        &self,
        caller: &Caller,
        req: wire::PushRequest,
    ) -> Result<wire::PushReply, Status> {
        caller.may_change()?;
        let source = if req.source_name.is_empty() {
            "pack".to_string()
        } else {
            req.source_name.clone()
        };
        let pack = parse_pack(&req.yaml)
            .map_err(|e| Status::invalid_argument(e.render(&source).trim_end().to_string()))?;
        if !caller.sees(&pack.tenant) {
            return Err(Status::permission_denied(format!(
                "{}: pack {} is of tenant {}, not the caller's",
                caller.who, pack.id, pack.tenant
            )));
        }
        let now = RefTime::from_nanos(now_ns());
        pack.check_live(now)
            .map_err(|e| Status::invalid_argument(e.render(&source).trim_end().to_string()))?;
        let row = PackVersionRow {
            tenant: pack.tenant.clone(),
            pack: pack.id.clone(),
            version: pack.version,
            yaml: req.yaml,
            targets: convert::targets(&pack),
            pushed_ns: now.as_nanos(),
        };
        self.deliver(row, now).await
    }

    async fn do_cancel(
        &self,
        caller: &Caller,
        req: wire::CancelRequest,
    ) -> Result<wire::CancelReply, Status> {
        caller.may_change()?;
        // Another tenant's pack is "not found", like one that does not exist.
        let tenant = caller
            .tenant_of(&req.tenant)
            .ok_or_else(|| Status::not_found(format!("no pack {}/{}", req.tenant, req.pack)))?;
        let store = &self.shared.store;
        let p = store
            .cancel_pack(&tenant, &req.pack, now_ns())
            .await
            .map_err(store_status)?;
        let agents = store.agents().await.map_err(store_status)?;
        let mut told = holders(&agents, &tenant, &req.pack);
        for a in &agents {
            if a.targeted_by(&p.latest) {
                told.insert(a.id.clone());
            }
        }
        let mut told: Vec<String> = told.into_iter().collect();
        told.sort();
        for id in &told {
            self.shared.hub.send(
                id,
                SessionCmd::Cancel {
                    tenant: tenant.clone(),
                    pack: req.pack.clone(),
                    version: p.latest.version,
                },
            );
        }
        tracing::info!(pack = %format!("{tenant}/{}", req.pack), agents = told.len(), "cancelled");
        Ok(wire::CancelReply {
            pack: Some(convert::wire_ref(&tenant, &req.pack, p.latest.version)),
            agents: told,
        })
    }

    /// The agent `id` if the caller sees it through `tenant` (every agent
    /// without identities); otherwise "no agent", word for word like one
    /// that does not exist.
    async fn visible_agent(
        &self,
        caller: &Caller,
        tenant: Option<&str>,
        id: &str,
    ) -> Result<AgentRow, Status> {
        let store = &self.shared.store;
        let missing = || Status::not_found(format!("no agent {id}"));
        let agent = store
            .agent(id)
            .await
            .map_err(store_status)?
            .ok_or_else(missing)?;
        let Some(t) = tenant.filter(|_| caller.tenant().is_some()) else {
            return Ok(agent);
        };
        let packs = store.packs(Some(t)).await.map_err(store_status)?;
        if caller
            .visible_agents(std::slice::from_ref(&agent), &packs)
            .contains(id)
        {
            Ok(agent)
        } else {
            Err(missing())
        }
    }

    async fn do_label(
        &self,
        caller: &Caller,
        req: wire::LabelAgentRequest,
    ) -> Result<wire::LabelAgentReply, Status> {
        caller.may_manage_agents()?;
        let id = &req.agent_id;
        let tenant = caller
            .tenant_of(&req.tenant)
            .ok_or_else(|| Status::not_found(format!("no agent {id}")))?;
        convert::check_ident("agent id", id).map_err(|e| Status::invalid_argument(e.0))?;
        let mut set: LabelOverrides = convert::labels(&req.set)
            .map_err(|e| Status::invalid_argument(e.0))?
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect();
        for k in req.remove.iter().chain(&req.reset) {
            convert::label_key(k).map_err(|e| Status::invalid_argument(e.0))?;
            if set.contains_key(k) {
                return Err(Status::invalid_argument(format!(
                    "label {k:?} is both set and removed or reset"
                )));
            }
        }
        for k in &req.remove {
            set.insert(k.clone(), None);
        }
        if set.is_empty() && req.reset.is_empty() {
            return Err(Status::invalid_argument(
                "nothing to change: give labels to set (k=v), remove or reset",
            ));
        }
        self.visible_agent(caller, Some(&tenant), id).await?;
        let a = self
            .shared
            .store
            .label_agent(id, &tenant, set, req.reset.clone())
            .await
            .map_err(store_status)?;
        // The agent's stream re-reads its labels and reconciles (a pack may
        // now target it, or no longer); offline, its next hello does.
        self.shared.hub.send(id, SessionCmd::Relabelled);
        tracing::info!(agent = %id, tenant = %tenant, "agent labels changed");
        Ok(wire::LabelAgentReply {
            agent_id: id.clone(),
            labels: a.labels_for(&tenant).into_owned().into_iter().collect(),
            agent_labels: a.labels.into_iter().collect(),
            tenant,
        })
    }

    async fn do_forget(
        &self,
        caller: &Caller,
        req: wire::ForgetAgentRequest,
    ) -> Result<wire::ForgetAgentReply, Status> {
        caller.may_manage_agents()?;
        let id = &req.agent_id;
        // Without identities and without a tenant named: the whole fleet's.
        let tenant = match (caller.tenant(), req.tenant.as_str()) {
            (None, "") => None,
            _ => Some(
                caller
                    .tenant_of(&req.tenant)
                    .ok_or_else(|| Status::not_found(format!("no agent {id}")))?,
            ),
        };
        let agent = self.visible_agent(caller, tenant.as_deref(), id).await?;
        let store = &self.shared.store;
        let whole = match &tenant {
            None => true,
            Some(t) => {
                let packs = store.packs(None).await.map_err(store_status)?;
                !used_by_other_tenant(&agent, &packs, t)
            }
        };
        let mut disconnected = false;
        if whole {
            // Close the stream first, so that it writes nothing after.
            disconnected = self.shared.hub.send(id, SessionCmd::Forgotten);
            store.forget_agent(id, None).await.map_err(store_status)?;
        } else {
            store
                .forget_agent(id, tenant.as_deref())
                .await
                .map_err(store_status)?;
            self.shared.hub.send(id, SessionCmd::Relabelled);
        }
        tracing::info!(agent = %id, whole, disconnected, "agent forgotten");
        Ok(wire::ForgetAgentReply {
            agent_id: id.clone(),
            record_deleted: whole,
            disconnected,
        })
    }

    /// Store a pack version, then its deliveries, then send it.
    async fn deliver(&self, row: PackVersionRow, now: RefTime) -> Result<wire::PushReply, Status> {
        let store = &self.shared.store;
        let put = store.put_pack(row.clone()).await.map_err(store_status)?;
        let agents = store.agents().await.map_err(store_status)?;
        let mut targeted = Vec::new();
        let mut writes = tokio::task::JoinSet::new();
        let existing = store
            .deliveries_of_pack(&row.tenant, &row.pack, row.version)
            .await
            .map_err(store_status)?;
        for a in &agents {
            if a.targeted_by(&row) {
                targeted.push(a.id.clone());
                let known = existing.iter().any(|d| d.agent_id == a.id);
                if put == PutPack::Unchanged && known {
                    continue;
                }
                let connected = self.shared.hub.is_connected(&a.id);
                let d = DeliveryRow {
                    agent_id: a.id.clone(),
                    tenant: row.tenant.clone(),
                    pack: row.pack.clone(),
                    version: row.version,
                    state: DeliveryState::Pending,
                    reason: if connected {
                        "sending".into()
                    } else {
                        "agent not connected".into()
                    },
                    errors: Vec::new(),
                    updated_ns: now.as_nanos(),
                    attempts: 0,
                };
                // Concurrent: the store's writer commits them in a few
                // batches instead of one transaction per agent.
                let store = store.clone();
                self.shared.metrics.delivery(d.state);
                writes.spawn(async move { store.put_delivery(d).await });
            } else if a
                .held
                .iter()
                .any(|h| h.tenant == row.tenant && h.pack == row.pack)
            {
                // A new version no longer for this agent: withdraw its copy.
                self.shared.hub.send(
                    &a.id,
                    SessionCmd::Cancel {
                        tenant: row.tenant.clone(),
                        pack: row.pack.clone(),
                        version: row.version,
                    },
                );
            }
        }
        while let Some(r) = writes.join_next().await {
            r.map_err(|e| Status::internal(e.to_string()))?
                .map_err(store_status)?;
        }
        for id in &targeted {
            self.shared.hub.send(id, SessionCmd::Deliver(row.clone()));
        }
        tracing::info!(
            pack = %format!("{}/{}", row.tenant, row.pack),
            version = row.version,
            agents = targeted.len(),
            unchanged = put == PutPack::Unchanged,
            "pushed"
        );
        Ok(wire::PushReply {
            pack: Some(convert::wire_ref(&row.tenant, &row.pack, row.version)),
            unchanged: put == PutPack::Unchanged,
            agents: targeted,
        })
    }
}

fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::VersionTaken { .. } | StoreError::VersionOlder { .. } => {
            Status::failed_precondition(e.to_string())
        }
        StoreError::NoSuchPack { .. } | StoreError::NoSuchAgent { .. } => {
            Status::not_found(e.to_string())
        }
        StoreError::Backend(_) | StoreError::Closed => Status::unavailable(e.to_string()),
    }
}

fn nonempty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Every call first takes its caller (an agent certificate is refused),
/// then confines it to its tenant and role.
#[tonic::async_trait]
impl wire::admin_server::Admin for AdminService {
    async fn push(
        &self,
        request: Request<wire::PushRequest>,
    ) -> Result<Response<wire::PushReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let target = if req.source_name.is_empty() {
            "pack".to_string()
        } else {
            req.source_name.clone()
        };
        let tenant = caller.tenant().unwrap_or("").to_string();
        let r = self.do_push(&caller, req).await;
        let target = match &r {
            Ok(reply) => reply.pack.as_ref().map_or(target, |p| {
                format!("{}/{} v{}", p.tenant, p.pack, p.version)
            }),
            Err(_) => target,
        };
        let tenant = match &r {
            Ok(reply) => reply.pack.as_ref().map_or(tenant, |p| p.tenant.clone()),
            Err(_) => tenant,
        };
        self.record(&caller, &tenant, "push", &target, r)
            .await
            .map(Response::new)
    }

    async fn cancel(
        &self,
        request: Request<wire::CancelRequest>,
    ) -> Result<Response<wire::CancelReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let named = if req.tenant.is_empty() {
            caller.tenant().unwrap_or("default").to_string()
        } else {
            req.tenant.clone()
        };
        let target = format!("{named}/{}", req.pack);
        let r = self.do_cancel(&caller, req).await;
        self.record(&caller, &named, "cancel", &target, r)
            .await
            .map(Response::new)
    }

    async fn list_packs(
        &self,
        request: Request<wire::ListPacksRequest>,
    ) -> Result<Response<wire::ListPacksReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let store = &self.shared.store;
        let tenant = match (caller.tenant(), nonempty(&req.tenant)) {
            (None, t) => t,
            (Some(own), Some(t)) if t != own => {
                return Ok(Response::new(wire::ListPacksReply { packs: Vec::new() }));
            }
            (Some(own), _) => Some(own.to_string()),
        };
        let packs = store.packs(tenant.as_deref()).await.map_err(store_status)?;
        let mut out = Vec::with_capacity(packs.len());
        for p in packs {
            let l = &p.latest;
            let ds = store
                .deliveries_of_pack(&l.tenant, &l.pack, l.version)
                .await
                .map_err(store_status)?;
            let count = |s: DeliveryState| ds.iter().filter(|d| d.state == s).count() as u32;
            out.push(wire::PackSummary {
                pack: Some(convert::wire_ref(&l.tenant, &l.pack, l.version)),
                targets: l.targets.to_string(),
                pushed_ns: l.pushed_ns,
                cancelled: p.cancelled_ns.is_some(),
                acked: count(DeliveryState::Acked),
                nacked: count(DeliveryState::Nacked),
                pending: count(DeliveryState::Pending),
            });
        }
        Ok(Response::new(wire::ListPacksReply { packs: out }))
    }

    async fn list_agents(
        &self,
        request: Request<wire::ListAgentsRequest>,
    ) -> Result<Response<wire::ListAgentsReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let agents = self.shared.store.agents().await.map_err(store_status)?;
        let packs = match caller.tenant() {
            Some(t) => self
                .shared
                .store
                .packs(Some(t))
                .await
                .map_err(store_status)?,
            None => Vec::new(),
        };
        let visible = caller.visible_agents(&agents, &packs);
        let agents = agents
            .into_iter()
            .filter(|a| visible.contains(&a.id))
            .map(|mut a| {
                // Only the caller's tenant's packs are listed.
                a.held.retain(|h| caller.sees(&h.tenant));
                a
            })
            .map(|a| wire::AgentSummary {
                connected: self.shared.hub.is_connected(&a.id),
                lateness_p99_ns: self.shared.lateness_p99(&a.id),
                // As the caller's tenant's packs target on them.
                labels: a
                    .labels_for(caller.tenant().unwrap_or("default"))
                    .into_owned()
                    .into_iter()
                    .collect(),
                agent_version: a.agent_version,
                last_seen_ns: a.last_seen_ns,
                clock: a.clock.as_ref().map(convert::clock_to_wire),
                packs: convert::held_to_wire(&a.held),
                id: a.id,
            })
            .collect();
        Ok(Response::new(wire::ListAgentsReply { agents }))
    }

    async fn deliveries(
        &self,
        request: Request<wire::DeliveriesRequest>,
    ) -> Result<Response<wire::DeliveriesReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let tenant = caller
            .tenant_of(&req.tenant)
            .ok_or_else(|| Status::not_found(format!("no pack {}/{}", req.tenant, req.pack)))?;
        let store = &self.shared.store;
        let version = if req.version == 0 {
            store
                .pack_version(&tenant, &req.pack, None)
                .await
                .map_err(store_status)?
                .ok_or_else(|| Status::not_found(format!("no pack {tenant}/{}", req.pack)))?
                .version
        } else {
            req.version
        };
        let ds = store
            .deliveries_of_pack(&tenant, &req.pack, version)
            .await
            .map_err(store_status)?;
        Ok(Response::new(wire::DeliveriesReply {
            pack: Some(convert::wire_ref(&tenant, &req.pack, version)),
            deliveries: ds.iter().map(convert::delivery_to_wire).collect(),
        }))
    }

    type QueryFeedbackStream = BoxStream<wire::FeedbackRecord>;

    async fn query_feedback(
        &self,
        request: Request<wire::FeedbackQuery>,
    ) -> Result<Response<Self::QueryFeedbackStream>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        // Another tenant's feedback: as if there were none.
        let Some(tenant) = caller.tenant_of(&req.tenant) else {
            return Ok(Response::new(Box::pin(tokio_stream::iter(Vec::new()))));
        };
        let rows = self
            .shared
            .store
            .feedback(FeedbackFilter {
                tenant: Some(tenant),
                pack: nonempty(&req.pack),
                agent_id: nonempty(&req.agent_id),
                since_ns: (req.since_ns != 0).then_some(req.since_ns),
                limit: (req.limit != 0).then_some(req.limit),
            })
            .await
            .map_err(store_status)?;
        let it = rows.into_iter().map(|r| Ok(convert::feedback_to_wire(&r)));
        Ok(Response::new(Box::pin(tokio_stream::iter(it))))
    }

    type WatchStream = BoxStream<wire::WatchEvent>;

    async fn watch(
        &self,
        request: Request<wire::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (caller, serial) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let pack = nonempty(&req.pack);
        let (tenant, mut agents) = match caller.tenant() {
            None => (nonempty(&req.tenant), None),
            Some(own) => {
                if !req.tenant.is_empty() && req.tenant != own {
                    return Err(Status::not_found(format!("no tenant {}", req.tenant)));
                }
                // Agent events of the agents visible now; the set follows
                // deliveries of the tenant's packs to other agents at once,
                // and is read again from the store every WATCH_REFRESH.
                (
                    Some(own.to_string()),
                    Some(visible_now(&self.shared, &caller, own).await?),
                )
            }
        };
        let shared = self.shared.clone();
        let mut refresh =
            tokio::time::interval_at(tokio::time::Instant::now() + WATCH_REFRESH, WATCH_REFRESH);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rx = self.shared.events.subscribe();
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
                            learn(&mut agents, &ev, tenant.as_deref());
                            if !visible(&ev, tenant.as_deref(), pack.as_deref(), agents.as_ref()) {
                                continue;
                            }
                            ev
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => wire::WatchEvent {
                            body: Some(Ev::Lagged(n)),
                        },
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = shutdown.changed() => return,
                    _ = tx.closed() => return,
                    _ = refresh.tick(), if agents.is_some() => {
                        if let Some(t) = tenant.as_deref() {
                            match visible_now(&shared, &caller, t).await {
                                Ok(now) => agents = Some(now),
                                Err(e) => tracing::warn!("watch: agents not re-read: {}", e.message()),
                            }
                        }
                        continue;
                    }
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
        let stream = ReceiverStream::new(out);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn clock_history(
        &self,
        request: Request<wire::ClockHistoryRequest>,
    ) -> Result<Response<wire::ClockHistoryReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        // The same answer for an agent that does not exist and one another
        // tenant's packs alone reach: nothing leaks.
        self.visible_agent(&caller, caller.tenant(), &req.agent)
            .await?;
        let mut rows = self
            .shared
            .store
            .clock_history(&req.agent, req.since_ns)
            .await
            .map_err(store_status)?;
        let cap = match req.limit {
            0 => CLOCK_HISTORY_CAP,
            n => (n as usize).min(CLOCK_HISTORY_CAP),
        };
        if rows.len() > cap {
            rows.drain(..rows.len() - cap);
        }
        Ok(Response::new(wire::ClockHistoryReply {
            reports: rows.iter().map(convert::clock_to_wire).collect(),
        }))
    }

    async fn audit(
        &self,
        request: Request<wire::AuditQuery>,
    ) -> Result<Response<wire::AuditReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        caller.may_audit()?;
        let req = request.into_inner();
        let rows = self
            .shared
            .store
            .audit(
                caller.tenant(),
                req.since_ns,
                (req.limit != 0).then_some(req.limit),
            )
            .await
            .map_err(store_status)?;
        Ok(Response::new(wire::AuditReply {
            records: rows
                .into_iter()
                .map(|r| wire::AuditRecord {
                    at_ns: r.at_ns,
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
        let named = audit_tenant(&caller, &req.tenant);
        let mut what: Vec<String> = req.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
        what.sort();
        what.extend(req.remove.iter().map(|k| format!("-{k}")));
        what.extend(req.reset.iter().map(|k| format!("reset {k}")));
        let target = format!("agent {}: {}", req.agent_id, what.join(" "));
        let r = self.do_label(&caller, req).await;
        self.record(&caller, &named, "label", &target, r)
            .await
            .map(Response::new)
    }

    async fn forget_agent(
        &self,
        request: Request<wire::ForgetAgentRequest>,
    ) -> Result<Response<wire::ForgetAgentReply>, Status> {
        let (caller, _) = self.caller(request.extensions())?;
        let req = request.into_inner();
        let named = audit_tenant(&caller, &req.tenant);
        let id = req.agent_id.clone();
        let r = self.do_forget(&caller, req).await;
        let target = match &r {
            Ok(f) if f.record_deleted => format!("agent {id} (whole record)"),
            Ok(_) => format!("agent {id} (this tenant's deliveries and labels)"),
            Err(_) => format!("agent {id}"),
        };
        self.record(&caller, &named, "forget", &target, r)
            .await
            .map(Response::new)
    }
}

/// The tenant an audit record of a request names: the one asked for, else
/// the caller's (`default` without identities). A tenant operator naming
/// another tenant is recorded under its own (the other name is not its to
/// read back).
fn audit_tenant(caller: &Caller, requested: &str) -> String {
    match (caller.tenant(), requested) {
        (Some(own), _) => own.to_string(),
        (None, "") => "default".to_string(),
        (None, r) => r.to_string(),
    }
}

/// How often a tenant's watcher reads again which agents it sees.
const WATCH_REFRESH: std::time::Duration = std::time::Duration::from_secs(10);

/// The agents `caller` sees through tenant `t`'s packs, now.
async fn visible_now(
    shared: &Shared,
    caller: &Caller,
    t: &str,
) -> Result<std::collections::HashSet<String>, Status> {
    let all = shared.store.agents().await.map_err(store_status)?;
    let packs = shared.store.packs(Some(t)).await.map_err(store_status)?;
    Ok(caller.visible_agents(&all, &packs))
}

/// A delivery of the watcher's tenant to an agent makes that agent visible
/// to it (its pack targets it now).
fn learn(
    agents: &mut Option<std::collections::HashSet<String>>,
    ev: &wire::WatchEvent,
    tenant: Option<&str>,
) {
    if let (Some(set), Some(Ev::Delivery(d)), Some(t)) = (agents.as_mut(), &ev.body, tenant)
        && d.pack.as_ref().is_some_and(|p| p.tenant == t)
        && !set.contains(&d.agent_id)
    {
        set.insert(d.agent_id.clone());
    }
}

/// Whether a watcher filtering on tenant / pack sees this event (agent
/// events: those of `agents`, all when `None`).
fn visible(
    ev: &wire::WatchEvent,
    tenant: Option<&str>,
    pack: Option<&str>,
    agents: Option<&std::collections::HashSet<String>>,
) -> bool {
    let r = match &ev.body {
        Some(Ev::Feedback(f)) => f.entry.as_ref().and_then(|e| e.pack.as_ref()),
        Some(Ev::Delivery(d)) => d.pack.as_ref(),
        Some(Ev::Agent(a)) => return agents.is_none_or(|s| s.contains(&a.agent_id)),
        _ => return true,
    };
    let Some(r) = r else { return false };
    tenant.is_none_or(|t| r.tenant == t) && pack.is_none_or(|p| r.pack == p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_watch_learns_agents_its_packs_reach() {
        let delivery = |tenant: &str, agent: &str| wire::WatchEvent {
            body: Some(Ev::Delivery(wire::Delivery {
                agent_id: agent.into(),
                pack: Some(convert::wire_ref(tenant, "p", 1)),
                ..Default::default()
            })),
        };
        let agent_ev = |agent: &str| wire::WatchEvent {
            body: Some(Ev::Agent(wire::AgentEvent {
                agent_id: agent.into(),
                ..Default::default()
            })),
        };
        let mut seen = Some(std::collections::HashSet::from(["a1".to_string()]));
        let t = Some("plant-a");
        assert!(!visible(&agent_ev("a2"), t, None, seen.as_ref()));
        // Another tenant's delivery to a2 teaches nothing (and is not shown).
        learn(&mut seen, &delivery("plant-b", "a2"), t);
        assert!(!visible(&delivery("plant-b", "a2"), t, None, seen.as_ref()));
        assert!(!visible(&agent_ev("a2"), t, None, seen.as_ref()));
        // Its own pack reaching a2: a2's events are shown from now on.
        learn(&mut seen, &delivery("plant-a", "a2"), t);
        assert!(visible(&agent_ev("a2"), t, None, seen.as_ref()));
        // Without a tenant every agent is visible; nothing to learn.
        let mut all = None;
        learn(&mut all, &delivery("plant-a", "a2"), None);
        assert!(all.is_none() && visible(&agent_ev("zz"), None, None, None));
    }
}
