//! A TCP relay between the bench's clients and a server: it counts round trips
//! (a client's bytes after the server last spoke, or first, start one: a
//! pipeline or a Parse/Bind/Execute/Sync written at once is one) and holds
//! every chunk for a one-way delay before passing it on, in order. The
//! kernel here has no `netem` (CONFIG_NET_SCH_NETEM is not set), so the delay
//! is this delay line's.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running relay: connect to `addr` instead of the server.
pub struct Relay {
    pub addr: SocketAddr,
    round_trips: Arc<AtomicU64>,
    one_way_us: Arc<AtomicU64>,
}

impl Relay {
    /// Listens on 127.0.0.1 (inside the bench's namespace) for `upstream`.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let addr = listener.local_addr().unwrap();
        let round_trips = Arc::new(AtomicU64::new(0));
        let counter = round_trips.clone();
        let one_way_us = Arc::new(AtomicU64::new(one_way.as_micros() as u64));
        let delay = one_way_us.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                for s in [&client, &server] {
                    let _ = s.set_nodelay(true);
                }
                // The client's turn: its next bytes start a round trip.
                let client_turn = Arc::new(AtomicBool::new(true));
                let up = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (turn, count) = (client_turn.clone(), counter.clone());
                pump(up.0, up.1, delay.clone(), move || {
                    if turn.swap(false, Ordering::SeqCst) {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                });
                pump(server, client, delay.clone(), move || {
                    client_turn.store(true, Ordering::SeqCst)
                });
            }
        });
        Relay {
            addr,
            round_trips,
            one_way_us,
        }
    }

    /// Changes the one-way delay (connections already open take it too).
    pub fn set_delay(&self, one_way: Duration) {
        self.one_way_us
            .store(one_way.as_micros() as u64, Ordering::Relaxed);
    }

    /// Round trips since the relay started.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read
/// (`on_read` runs as it is read).
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    delay_us: Arc<AtomicU64>,
    on_read: impl Fn() + Send + 'static,
) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    on_read();
                    let delay = Duration::from_micros(delay_us.load(Ordering::Relaxed));
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (due, chunk) in rx {
            // (A sleep overshoots by tens of microseconds; `Relay::set_delay`
            // calibrates for it. A spin or yield would starve the servers of
            // a 2-core machine.)
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
