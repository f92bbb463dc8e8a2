//! Revocations the controller picks up: the CA directory's list re-read
//! when it changes ([`super::tls`]) and handed to the application, which
//! records each new serial once, with its audit records
//! ([`baton_app::revocations`]); and the serials any replica recorded,
//! joined to this one's list ([`follow_revocations`]) since `ca revoke`
//! may have run on another host.

use std::sync::Arc;

use baton_app::AppError;
use baton_pki::ca::{self, CaDir, RevokedEntry};
use baton_pki::identity::Identity;

use crate::shared::Shared;

/// The revocation list's entries (`None`: unreadable just now; the TLS
/// side keeps its previous list and says so too).
async fn read_entries(dir: &CaDir) -> Result<Option<Vec<RevokedEntry>>, AppError> {
    let path = dir.revoked();
    let read = tokio::task::spawn_blocking({
        let path = path.clone();
        move || ca::read_revoked_entries(&path)
    })
    .await;
    Ok(Some(match read {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => {
            // The TLS side logs it too and keeps the previous list.
            tracing::warn!("revocations not audited: {e}");
            return Ok(None);
        }
        Err(e) => {
            return Err(AppError::Unavailable(format!(
                "reading {}: {e}",
                path.display()
            )));
        }
    }))
}

/// Record the revocations listed now that the log does not have yet.
async fn record_new(shared: &Shared, dir: &CaDir) -> Result<usize, AppError> {
    let Some(entries) = read_entries(dir).await? else {
        return Ok(0);
    };
    if entries.is_empty() {
        return Ok(0);
    }
    let operator_tenant = |name: &str| {
        ca::read_cert(&dir.leaf_cert(ca::Kind::Operator, name))
            .ok()
            .and_then(|c| match c.identity {
                Identity::Operator { tenant, .. } => Some(tenant),
                _ => None,
            })
    };
    shared
        .app
        .record_revocations(&entries, operator_tenant)
        .await
}

/// Until the controller stops: every [`SHARED_EVERY`], the serials any
/// replica recorded as revoked join this one's list (its own CA
/// directory's `revoked.txt` may not have them: `ca revoke` ran on
/// another host).
pub async fn follow_revocations(shared: Arc<Shared>, tls: Arc<super::tls::TlsState>) {
    let mut tick = tokio::time::interval(SHARED_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = shared.shutdown.clone();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        match shared.app.revoked_serials().await {
            Ok(serials) => tls.set_shared_revoked(serials.into_iter().collect()),
            Err(e) => tracing::warn!("cannot read the revocations other replicas recorded: {e}"),
        }
    }
}

/// How often the store's revocations are read.
pub const SHARED_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Until the controller stops: every time the revocation list is (re)read,
/// audit what is new in it.
pub async fn audit_revocations(shared: Arc<Shared>, dir: CaDir) {
    let mut revoked = shared.revoked.subscribe();
    revoked.mark_changed();
    let mut stop = shared.shutdown.clone();
    loop {
        tokio::select! {
            r = revoked.changed() => {
                if r.is_err() {
                    return;
                }
                revoked.borrow_and_update();
                if let Err(e) = record_new(&shared, &dir).await {
                    // Tried again at the next change of the list.
                    tracing::error!("revocations not audited: {e}");
                }
            }
            _ = stop.changed() => return,
        }
    }
}
