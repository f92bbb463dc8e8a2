//! The [`Store`] contract: one conformance suite that every backend runs,
//! after object_store's `integration.rs`. Each `pub async fn`
//! takes a fresh, empty store opened with the [`Binding`] it is given and
//! checks one part of the trait's documented behaviour; a backend's tests
//! call them all through [`contract_suite!`], which makes one
//! `#[tokio::test]` per function and binding:
//!
//! ```ignore
//! fn open(binding: Binding) -> (MyStore, Guard) { ... }
//! crate::contract::contract_suite!(open);
//! ```
//!
//! [`random_equivalence`] is the suite's property test: random sequences
//! of hellos, held sets, labels, grants, pushes, cancels and answers, after
//! each of which the store's rows must equal an oracle that re-plans every
//! (agent, pack) pair from scratch with [`planner::plan`]. That is what
//! proves a backend's shortcuts (an index looked up for only the first
//! label, plans limited to the pairs a change can affect) never miss an
//! agent.
//!
//! The expectations are written from the trait's docs and the planner's
//! rules, never from what a backend happens to do.

mod agents;
mod deliveries;
mod feedback;
mod fixtures;
mod fleet;
mod packs;
mod random;
mod releases;
mod retention;
mod rollouts;
mod sessions;

pub use agents::*;
pub use deliveries::*;
pub use feedback::*;
pub use fixtures::*;
pub use fleet::*;
pub use packs::*;
pub use random::*;
pub use releases::*;
pub use retention::*;
pub use rollouts::*;
pub use sessions::*;

// ---------------------------------------------------------------------------
// The suite, for a backend's tests.

/// One `#[tokio::test]` per contract function and binding (a module per
/// function, a test per binding), against the stores `$open(binding)`
/// makes: `(store, guard)`, where `guard` (a temporary directory, or `()`)
/// outlives the store.
#[macro_export]
macro_rules! contract_suite {
    ($open:ident) => {
        fn always_available() -> bool {
            true
        }
        $crate::contract_suite!($open, always_available);
    };
    // `$available()`: whether the backend can run here at all (a test
    // without it returns at once; the backend's helper says why).
    ($open:ident, $available:ident) => {
        $crate::contract_suite!(@tests $open, $available;
            hello_creates_and_updates: [tenants, open];
            stale_streams_are_fenced: [tenants];
            events_page_by_mark: [tenants];
            revocations_once_per_serial: [tenants];
            agent_seen_and_all_disconnected: [tenants];
            clock_latest_and_history: [tenants];
            trust_said_at_hello_and_after: [tenants];
            agents_paging: [tenants, open];
            labels_set_hide_reset: [tenants, open];
            grants_replan: [tenants, open];
            forget_agent_parts: [tenants, open];
            put_pack_versions: [tenants];
            cancel_known_pack: [tenants, open];
            cancel_unknown_pack: [tenants, open];
            withdraw_from_chosen_agents: [tenants, open];
            reconcile_pack_targets: [tenants, open];
            agent_held_rules: [tenants, open];
            answers: [tenants, open];
            answers_together: [tenants, open];
            deliveries_of_pack_paging: [tenants];
            a_push_to_many_agents_plans_each: [tenants, open];
            a_rollout_gates_its_version: [tenants];
            a_push_or_cancel_supersedes_a_rollout: [tenants];
            outsiders_never_get_an_aborted_or_cancelled_version_back: [tenants];
            deliveries_of_pairs: [tenants];
            delivery_counts: [tenants];
            feedback_stored_once: [tenants];
            feedback_drops_on_a_resent_entry: [tenants];
            feedback_all_or_nothing: [tenants];
            feedback_through_retention: [tenants];
            feedback_pages_and_filters: [tenants];
            feedback_of_a_pack_followed_by_mark: [tenants];
            retention_oldest_first: [tenants];
            audit_newest_oldest_first: [tenants];
            pages_capped: [tenants];
            values_past_i64_max_refused: [tenants];
            fleet_filters_equal_a_naive_filter: [tenants, open];
            fleet_a_tenant_sees_only_its_own: [tenants, open];
            fleet_text_is_literal: [tenants];
            fleet_unhealthy_is_offline_unlocked_or_refusing: [tenants];
            sessions_open_read_expire_close: [tenants];
            sessions_capped_per_certificate_and_in_all: [tenants];
            sessions_end_with_their_certificate: [tenants];
            login_failures_counted_per_source_and_window: [tenants];
            releases_stored_once_and_served_by_piece: [tenants];
            release_offered_by_target_and_arch: [tenants];
            a_stage_of_many_boxes_offers_each_once: [tenants];
            agent_updates_step_once_and_supersede: [tenants];
            update_said_and_fenced: [tenants];
        );
        mod random_equivalence {
            $crate::contract_suite!(@random $open, $available; tenants, open);
        }
    };
    (@tests $open:ident, $available:ident; $($name:ident: [$($b:ident),+];)+) => {
        $(
            mod $name {
                $(
                    #[tokio::test]
                    async fn $b() {
                        if !super::$available() {
                            return;
                        }
                        let binding = $crate::contract_suite!(@binding $b);
                        let (store, guard) = super::$open(binding);
                        $crate::contract::$name(&store, binding).await;
                        // The store first: the guard may be its directory.
                        drop(store);
                        let _ = guard;
                    }
                )+
            }
        )+
    };
    (@random $open:ident, $available:ident; $($b:ident),+) => {
        $(
            #[tokio::test]
            async fn $b() {
                if !super::$available() {
                    return;
                }
                let binding = $crate::contract_suite!(@binding $b);
                $crate::contract::random_equivalence(
                    &|b| {
                        let (store, guard) = super::$open(b);
                        (
                            Box::new(store) as Box<dyn $crate::Store>,
                            Box::new(guard) as Box<dyn std::any::Any>,
                        )
                    },
                    binding,
                )
                .await;
            }
        )+
    };
    (@binding tenants) => {
        $crate::Binding::Tenants
    };
    (@binding open) => {
        $crate::Binding::Open
    };
}
