//! The audit log: every push, cancel, label change, grant and forget,
//! refused ones included, written before the answer; every dashboard
//! log-in, and every refused one whose token was looked at.

use crate::app::{App, AppError, AppResult, now};
use baton_model::RefTime;

use crate::caller::Caller;
use baton_model::AuditRow;
use baton_model::identity::Identity;
use baton_store::StoreOps;

impl App {
    /// Record `action` on `target` in `tenant` and its result; a failed
    /// audit write fails the operation (an action that cannot be audited
    /// is not answered as done).
    pub async fn audited<T>(
        &self,
        caller: &Caller,
        tenant: &str,
        action: &str,
        target: &str,
        result: AppResult<T>,
    ) -> AppResult<T> {
        let text = match &result {
            Ok(_) => "ok".into(),
            Err(e) => format!("{}: {e}", kind(e)),
        };
        self.put_audit(caller, tenant, action, target, text).await?;
        result
    }

    /// Record a refusal made before the request reached the application
    /// (the server reading an upload's stream): the record [`App::audited`]
    /// writes for `Err(refused)`. Only the audit's own failure is an error.
    pub async fn audit_refusal(
        &self,
        caller: &Caller,
        tenant: &str,
        action: &str,
        target: &str,
        refused: &AppError,
    ) -> AppResult<()> {
        let text = format!("{}: {refused}", kind(refused));
        self.put_audit(caller, tenant, action, target, text).await
    }

    async fn put_audit(
        &self,
        caller: &Caller,
        tenant: &str,
        action: &str,
        target: &str,
        result: String,
    ) -> AppResult<()> {
        let (who, tenant, role) = caller.audit_fields(tenant);
        let row = AuditRow {
            at: now(),
            who,
            tenant,
            role,
            action: action.into(),
            target: target.into(),
            result,
        };
        self.store.put_audit(row).await?;
        Ok(())
    }

    /// Record a refused dashboard log-in from `source`: action `login`,
    /// target `dashboard from SOURCE`, result `Unauthenticated: WHY`.
    /// `whose`: the operator a known token was issued to (revoked,
    /// expired), recorded in its tenant with its role, so that its
    /// tenant's admins see someone still holds it; a token nobody was
    /// issued is recorded as `unknown`, role `none`, in no tenant
    /// (fleet-wide, as `ca`'s records of a revocation no tenant has a
    /// stake in). Nothing of the token is written: a mistyped token is
    /// mostly a real one.
    pub async fn audit_failed_login(
        &self,
        source: &str,
        whose: Option<&Identity>,
        why: &str,
    ) -> AppResult<()> {
        let (who, tenant, role) = match whose {
            Some(id) => Caller::new(id.clone()).audit_fields(""),
            None => ("unknown".into(), String::new(), "none".into()),
        };
        let row = AuditRow {
            at: now(),
            who,
            tenant,
            role,
            action: "login".into(),
            target: format!("dashboard from {source}"),
            result: format!("Unauthenticated: {why}"),
        };
        Ok(self.store.put_audit(row).await?)
    }

    /// The audit log (admins): the caller's tenant's, at or after
    /// `since`, the newest `limit`.
    pub async fn audit(
        &self,
        caller: &Caller,
        since: RefTime,
        limit: u32,
    ) -> AppResult<Vec<AuditRow>> {
        caller.may_audit()?;
        Ok(self.store.audit(caller.tenant(), since, limit).await?)
    }
}

/// The word for an error's kind in an audit record.
fn kind(e: &AppError) -> &'static str {
    match e {
        AppError::Invalid(_) => "InvalidArgument",
        AppError::NotFound(_) => "NotFound",
        AppError::Denied(_) => "PermissionDenied",
        AppError::Conflict(_) => "FailedPrecondition",
        AppError::Limit(_) => "ResourceExhausted",
        AppError::Unavailable(_) => "Unavailable",
    }
}
