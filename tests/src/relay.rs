//! A TCP relay on loopback between an agent and its controller whose link
//! a test can cut and restore, as a cable pulled and plugged back: the
//! agent keeps running (and firing) while its controller hears nothing.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;

/// The relay: connect to [`Relay::url`] instead of the controller.
#[derive(Debug)]
pub struct Relay {
    /// `http://127.0.0.1:PORT`, forwarding to the controller.
    pub url: String,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    /// Listens on a free loopback port and forwards every connection to
    /// `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let url = format!("http://{}", listener.local_addr().expect("relay address"));
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, o, up) = (cut.clone(), open.clone(), upstream.to_string());
        thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { continue };
                // Cut: the connection is refused at once (closed).
                if c.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(&up) else {
                    continue;
                };
                let mut kept = o.lock().unwrap_or_else(PoisonError::into_inner);
                for s in [&inbound, &outbound] {
                    if let Ok(s) = s.try_clone() {
                        kept.push(s);
                    }
                }
                drop(kept);
                pump(&inbound, &outbound);
                pump(&outbound, &inbound);
            }
        });
        Relay { url, cut, open }
    }

    /// Cuts the link: every open connection is shut down and new ones are
    /// closed as they come, until [`Relay::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        for s in open.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` on a thread of its own until either side ends.
fn pump(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
