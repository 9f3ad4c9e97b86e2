//! The steering layer's calls on OpenCode's server (`steering.rs`), made off the relay loop.
//!
//! Live, each [`Call`] is an HTTP request ([`caller`]) that the layer runs as a job ([`crate::layer::Cx::work`]):
//! on the engine's workers, its outcome, a [`ServerEvent::SteerCall`], the job's result. In a replay there is no
//! server: the outcomes are in the recording's events file, where the player writes them in the order they came
//! live. The [`Gate`] stands in for the server: the layer's calls open it, and the file's reader hands the layer
//! each recorded outcome (and so everything recorded after it) only once the layer has asked for that call, as
//! it had live.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::adapters::opencode::server::{FromServer, Server, ServerEvent, SteerCallKind};
use crate::adapters::opencode::steering::{Call, Caller};

/// Makes each call on `server` (blocking, on the job's thread) and gives its outcome.
pub fn caller(server: Server) -> Caller {
    Arc::new(move |call: Call| Some(make(&server, call)))
}

fn make(server: &Server, call: Call) -> ServerEvent {
    match call {
        Call::Post { session, directory, body } => match server.post_message(&directory, &session, &body) {
            Ok(message) => ServerEvent::SteerCall { session, call: SteerCallKind::Post, message, error: None },
            Err(e) => {
                ServerEvent::SteerCall { session, call: SteerCallKind::Post, message: String::new(), error: Some(e) }
            }
        },
        Call::Delete { session, directory, message } => {
            let error = server.delete_message(&directory, &session, &message).err();
            ServerEvent::SteerCall { session, call: SteerCallKind::Delete, message, error }
        }
    }
}

/// How long the replay's reader waits for the layer to ask for a call whose outcome is next in the file.
pub const GATE_PATIENCE: Duration = Duration::from_secs(30);

/// Replays: the calls asked for and not yet answered from the file.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<u64>, Condvar)>);

impl Gate {
    /// What the layer calls in a replay: counts the call; its outcome is the file's.
    pub fn caller(&self) -> Caller {
        let gate = self.clone();
        Arc::new(move |_| {
            let (asked, woken) = &*gate.0;
            *asked.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            woken.notify_all();
            None
        })
    }

    /// Waits until a call is asked for and not answered yet, then counts it answered; false after `patience`.
    pub fn release(&self, patience: Duration) -> bool {
        let (asked, woken) = &*self.0;
        let guard = asked.lock().unwrap_or_else(|p| p.into_inner());
        let (mut open, _) = woken.wait_timeout_while(guard, patience, |n| *n == 0).unwrap_or_else(|p| p.into_inner());
        if *open == 0 {
            return false;
        }
        *open -= 1;
        true
    }

    /// `send`, with each recorded call outcome held until the layer has asked for its call.
    pub fn gated(
        self,
        send: impl Fn(FromServer) -> bool + Send + 'static,
    ) -> impl Fn(FromServer) -> bool + Send + 'static {
        move |e| {
            if matches!(e, FromServer::Event(ServerEvent::SteerCall { .. })) && !self.release(GATE_PATIENCE) {
                tracing::warn!(
                    "the recording has the outcome of a steering call the shim did not make within {}s",
                    GATE_PATIENCE.as_secs()
                );
            }
            send(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_recorded_outcome_waits_for_its_call() {
        let gate = Gate::default();
        assert!(!gate.release(Duration::from_millis(10)), "nothing asked yet");
        let call = gate.caller();
        assert_eq!(call(Call::Delete { session: "s".into(), directory: "/w".into(), message: "m".into() }), None);
        assert!(gate.release(Duration::from_millis(10)));
        assert!(!gate.release(Duration::from_millis(10)), "one outcome per call");
        let waiting = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.release(Duration::from_secs(20)))
        };
        call(Call::Post { session: "s".into(), directory: "/w".into(), body: json!({}) });
        assert!(waiting.join().expect("the waiting reader"), "released by the call");
    }

    #[test]
    fn calls_on_a_server_that_is_not_there_come_back_failed() {
        // A port nobody listens on (bound, then freed).
        let port = std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).expect("port").port();
        let server = Server { host: "127.0.0.1".into(), port, auth: None };
        let post = make(&server, Call::Post { session: "ses_1".into(), directory: "/w".into(), body: json!({}) });
        let ServerEvent::SteerCall { session, call, message, error } = post else { panic!("{post:?}") };
        assert_eq!((session.as_str(), call, message.as_str()), ("ses_1", SteerCallKind::Post, ""));
        assert!(error.is_some());
        let delete =
            make(&server, Call::Delete { session: "ses_1".into(), directory: "/w".into(), message: "m".into() });
        assert!(matches!(delete, ServerEvent::SteerCall { call: SteerCallKind::Delete, error: Some(_), .. }));
    }
}
