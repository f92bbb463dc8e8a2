//! Small pieces of markup the pages and the live stream share: an
//! instant in the reader's time zone, a state as a badge, an agent's clock
//! with its age, how long ago. Below both, so neither imports the other
//! for them.

use maud::{Markup, html};

use baton_app::agents::AgentView;
use baton_app::rollout_view::Tone;
use baton_model::display::instant;
use baton_model::{DeliveryRow, DeliveryState};

/// An instant as the page shows it: UTC as the CLI prints it, in a
/// `<time>` the page's script shows in local time when the reader chose
/// that (one zone per page, named in the footer).
pub fn when(ns: i64) -> Markup {
    let text = instant(ns);
    html! {
        @if ns == 0 { "-" } @else { time datetime=(text) { (text) } }
    }
}

/// A state as a badge: its word always, its colour only beside it.
pub fn badge(tone: Tone, word: &str) -> Markup {
    html! { span class=(format!("badge {}", tone.as_str())) { (word) } }
}

/// An agent's clock as the page states it: a badge (locked only when
/// connected with a fresh locked report; an offline agent's or a stale
/// report is "last known", with its age) and the words.
pub fn clock_cell(v: &AgentView, now: i64) -> Markup {
    let a = &v.agent;
    html! {
        @match &a.clock {
            Some(c) => {
                @let age = now - c.at.as_nanos();
                @let fresh = v.connected && age <= STALE_NS;
                @if fresh && c.state == "locked" { (badge(Tone::Good, "locked")) }
                @else if fresh { (badge(Tone::Bad, &c.state)) }
                @else { (badge(Tone::Bad, "stale")) }
                " " (c.source) " / " (c.state)
                @if !fresh { " (last known, " (ago(c.at.as_nanos(), now)) ")" }
            }
            None => { (badge(Tone::Bad, "no report")) }
        }
    }
}

/// A clock report older than this is stale (agents report every few
/// seconds while connected): the fleet filter's bound too.
pub const STALE_NS: i64 = baton_model::CLOCK_STALE_NS;

/// How a delivery's state reads at a glance.
pub fn delivery_tone(s: DeliveryState) -> Tone {
    match s {
        DeliveryState::Acked | DeliveryState::Local => Tone::Good,
        DeliveryState::Pending | DeliveryState::Cancelled => Tone::Neutral,
        DeliveryState::Nacked => Tone::Bad,
    }
}

/// How long ago `ns` was, from `now_ns`, in words (`-` for never).
pub fn ago(ns: i64, now_ns: i64) -> String {
    if ns <= 0 {
        return "never".into();
    }
    let s = (now_ns - ns).max(0) / 1_000_000_000;
    match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// Every refused delivery of `rows`, once, near the top of a page:
/// `heading` gets their count, `whose` names each (the agent on a pack's
/// page, the pack on an agent's); then its message and each error at its
/// line.
pub fn refusals<'a>(
    rows: impl IntoIterator<Item = &'a DeliveryRow>,
    heading: impl Fn(usize) -> Markup,
    whose: impl Fn(&DeliveryRow) -> Markup,
) -> Markup {
    let refused: Vec<&DeliveryRow> = rows
        .into_iter()
        .filter(|d| d.state == DeliveryState::Nacked)
        .collect();
    html! {
        @if !refused.is_empty() {
            section #refusals .alert role="alert" aria-labelledby="refusals-h" {
                h2 #refusals-h { (heading(refused.len())) }
                ul {
                    @for d in &refused {
                        li {
                            (whose(d)) ": "
                            @match &d.refusal {
                                Some(f) => {
                                    (f.message)
                                    @for e in &f.errors { br; code { (e.line) ":" (e.column) " " (e.message) } }
                                }
                                None => { (d.reason) }
                            }
                        }
                    }
                }
            }
        }
    }
}
