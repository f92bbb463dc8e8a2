//! The frame of every page: a skip link, the navigation (what the
//! caller's role may use), the live-update status in words (never colour
//! alone), and the scripts, all from `/assets`.

use maud::{DOCTYPE, Markup, PreEscaped, html};

/// What the frame shows of the caller (built by `auth::Who::viewer`, so
/// the frame needs nothing of how a caller logged in).
#[derive(Clone, Debug)]
pub struct Viewer<'a> {
    /// The name shown.
    pub name: String,
    /// The session's CSRF token (empty without a cookie session).
    pub csrf: &'a str,
    /// A cookie session: a log-out button.
    pub logout: bool,
    /// May push and cancel: the Push entry.
    pub may_change: bool,
    /// May read the audit log: the Audit entry.
    pub may_audit: bool,
}

/// Which navigation entry is the current page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nav {
    /// `/`.
    Fleet,
    /// `/packs`.
    Packs,
    /// `/push`.
    Push,
    /// `/audit`.
    Audit,
    /// `/updates`.
    Updates,
    /// None of them.
    None,
}

fn head(title: &str, plots: bool) -> Markup {
    html! {
        meta charset="utf-8";
        meta name="viewport" content="width=device-width, initial-scale=1";
        // htmx would add a <style> element of its own: the CSP forbids it.
        meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false}"#;
        meta name="color-scheme" content="light dark";
        title { (title) " · baton" }
        link rel="icon" href="/assets/favicon.svg" type="image/svg+xml";
        link rel="stylesheet" href="/assets/app.css";
        @if plots { link rel="stylesheet" href="/assets/uPlot.min.css"; }
    }
}

/// A page for a logged-in caller. `live`: the `/live` query its live
/// parts listen to (none: a page that does not update).
pub fn page(title: &str, who: Viewer<'_>, nav: Nav, live: Option<&str>, body: Markup) -> Markup {
    frame(title, who, nav, live, body, false)
}

/// [`page`] with plots: only these load the plotting library (half of a
/// first load's bytes, which the fleet page has no use for).
pub fn plotted_page(
    title: &str,
    who: Viewer<'_>,
    nav: Nav,
    live: Option<&str>,
    body: Markup,
) -> Markup {
    frame(title, who, nav, live, body, true)
}

fn frame(
    title: &str,
    who: Viewer<'_>,
    nav: Nav,
    live: Option<&str>,
    body: Markup,
    plots: bool,
) -> Markup {
    let current = |n: Nav| if n == nav { Some("page") } else { None };
    let csrf = format!(r#"{{"X-CSRF-Token":"{}"}}"#, who.csrf);
    html! {
        (DOCTYPE)
        html lang="en" {
            head { (head(title, plots)) }
            body hx-headers=(csrf) {
                a.skip href="#main" { "Skip to content" }
                header {
                    nav aria-label="Main" {
                        a.brand href="/" { "baton" }
                        a href="/" aria-current=[current(Nav::Fleet)] { "Fleet" }
                        a href="/packs" aria-current=[current(Nav::Packs)] { "Packs" }
                        a href="/updates" aria-current=[current(Nav::Updates)] { "Updates" }
                        @if who.may_change {
                            a href="/push" aria-current=[current(Nav::Push)] { "Push" }
                        }
                        @if who.may_audit {
                            a href="/audit" aria-current=[current(Nav::Audit)] { "Audit" }
                        }
                    }
                    div.whoami {
                        span { (who.name) }
                        @if who.logout {
                            form method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(who.csrf);
                                button type="submit" { "Log out" }
                            }
                        }
                    }
                }
                @if let Some(q) = live {
                    div #live hx-ext="sse" sse-connect=(format!("/live?{q}")) {
                        main #main tabindex="-1" {
                            // What operators do here, as they do it (dashboard or CLI).
                            ul #notices .notices aria-live="polite" aria-label="Actions just taken" sse-swap="action" hx-swap="afterbegin" {}
                            (body)
                        }
                    }
                } @else {
                    main #main tabindex="-1" { (body) }
                }
                footer {
                    // One time zone per page; the script switches it and
                    // remembers the choice.
                    p #tz-note { span #tz-label { "Times in UTC." } " " button #tz-toggle type="button" { "Show local time" } }
                    @if live.is_some() {
                        p #live-status role="status" aria-live="polite" data-state="connecting" { "Live updates: connecting…" }
                    } @else {
                        p { "This page does not update by itself." }
                    }
                }
                (scripts(plots))
            }
        }
    }
}

fn scripts(plots: bool) -> Markup {
    html! {
        script src="/assets/htmx.min.js" {}
        script src="/assets/sse.min.js" {}
        @if plots { script src="/assets/uPlot.iife.min.js" {} }
        script src="/assets/app.js" {}
    }
}

/// A page without the navigation (log-in).
pub fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { (head(title, false)) }
            body {
                main #main { (body) }
                (PreEscaped(""))
            }
        }
    }
}
