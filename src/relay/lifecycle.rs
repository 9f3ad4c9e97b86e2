//! The session's lifecycle, as a sans-IO state machine: whether each peer is still read and written, the
//! stop ladder, and the drain deadline after the agent exits. The relay loop ([`super`]) feeds it what
//! happened, each with the time it read, and does what it is told ([`Action`]); it sleeps until
//! [`Lifecycle::poll_timeout`] and then calls [`Lifecycle::handle_timeout`], as quinn-proto's connection is
//! driven by quinn. No clock, no signal, no pipe is touched here, so every path runs on a virtual clock in
//! the tests below.
//!
//! The stop ladder runs from the moment the client is gone (its input ends or fails, its end of stdin hangs
//! up, a signal comes, it stops reading our output) or the agent's stdin is gone, whatever the queues hold:
//! the agent's stdin is closed once what is queued for it is handed over; at [`STDIN_GRACE`] whatever is
//! still queued is dropped, the client's input is no longer read, SIGTERM is sent and the agent's stdin
//! closed; at [`TERM_GRACE`] after that, SIGKILL of all it started. An agent that stops reading must not
//! keep the shim, or itself, alive, so no step waits on a queue. Once the agent's process has exited, what
//! it left in its group goes with it, and its last output is read for [`DRAIN_AFTER_EXIT`] at most. The
//! session is over once the agent has exited and its output has ended; an agent without a process has
//! exited (status 0) once its output ends.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use crate::child::{STDIN_GRACE, TERM_GRACE};

/// How long to wait for the child's last output once it has exited.
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// What the driver is to do, in the order given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Close the agent's stdin once its writer has written what it holds, and tell the watchdog the session
    /// ends (what the agent started is recorded while it still runs).
    CloseAgentStdin,
    /// Drop what is still queued for the agent (with a warning when there is any).
    DropAgentQueue,
    /// SIGTERM to the agent's process group.
    Terminate,
    /// SIGKILL of everything the agent started and of its group: the ladder's last step.
    KillAll,
    /// The agent has exited: mark it so for the watchdog, then SIGKILL what it left behind.
    KillLeftovers,
}

/// Where the stop ladder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ladder {
    Running,
    /// The client (or the agent's stdin) has gone; SIGTERM at the deadline.
    Stopping(Instant),
    /// SIGTERM sent; SIGKILL at the deadline.
    Termed(Instant),
    /// SIGKILL sent, or the agent exited: nothing more to send.
    Killed,
}

/// The lifecycle of one session; see the module docs.
#[derive(Debug)]
pub struct Lifecycle {
    /// The client's input is read.
    client_open: bool,
    /// The client closed its end of stdin while unread input may still wait (`transport::watch_hangup`).
    client_hung_up: bool,
    /// The agent's stdin is open (its writer takes frames).
    agent_stdin: bool,
    /// The agent's output is read.
    agent_open: bool,
    /// There is a process behind the agent's pipes, whose exit is waited for.
    has_process: bool,
    ladder: Ladder,
    exited: Option<ExitStatus>,
    drain_deadline: Option<Instant>,
    actions: VecDeque<Action>,
}

impl Lifecycle {
    /// A session with both peers open; `has_process` says whether the agent is a process to wait for.
    pub fn new(has_process: bool) -> Lifecycle {
        Lifecycle {
            client_open: true,
            client_hung_up: false,
            agent_stdin: true,
            agent_open: true,
            has_process,
            ladder: Ladder::Running,
            exited: None,
            drain_deadline: None,
            actions: VecDeque::new(),
        }
    }

    /// Whether the client's input is still read (and its hang-up watched).
    pub fn reads_client(&self) -> bool {
        self.client_open
    }

    /// Whether the agent's output is still read.
    pub fn reads_agent(&self) -> bool {
        self.agent_open
    }

    /// Whether the agent's exit is still waited for.
    pub fn awaits_exit(&self) -> bool {
        self.exited.is_none()
    }

    /// The agent's exit status once the session is over: the agent has exited and its output has ended.
    pub fn finished(&self) -> Option<ExitStatus> {
        self.exited.filter(|_| !self.agent_open)
    }

    /// The next thing for the driver to do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Called before every wait, with whether anything is still queued for the agent: once the client is
    /// gone and nothing is queued, the agent's stdin is closed; the ladder starts once the client or the
    /// agent's stdin is gone.
    pub fn before_wait(&mut self, now: Instant, agent_queue_empty: bool) {
        if !self.client_open && agent_queue_empty && self.agent_stdin {
            tracing::debug!("client closed its stdin; closing the agent's");
            self.close_agent_stdin();
        }
        if (!self.client_open || self.client_hung_up || !self.agent_stdin)
            && self.ladder == Ladder::Running
            && self.exited.is_none()
        {
            self.ladder = Ladder::Stopping(now + STDIN_GRACE);
        }
    }

    /// The client's input ended (or could not be read).
    pub fn client_input_ended(&mut self, _now: Instant) {
        self.client_open = false;
    }

    /// The client closed its end of stdin, whatever it left unread.
    pub fn client_hung_up(&mut self, _now: Instant) {
        if self.client_open {
            tracing::debug!("the client closed its end of stdin; stopping the agent");
            self.client_hung_up = true;
        }
    }

    /// Nobody reads our stdout any more: nothing we write can arrive, so the client has left. (The driver
    /// drops what was queued for it and its writer.)
    pub fn client_stopped_reading(&mut self, _now: Instant) {
        tracing::debug!("client stopped reading; shutting down");
        self.client_open = false;
    }

    /// The agent's stdin writer is gone (the agent closed its stdin). (The driver drops what was queued for
    /// it and its writer.)
    pub fn agent_stopped_reading(&mut self, _now: Instant) {
        self.agent_stdin = false;
    }

    /// A signal (SIGINT, SIGTERM, SIGHUP) came to the shim: the client is treated as gone.
    pub fn signal(&mut self, name: &str, _now: Instant) {
        tracing::info!("{name} received; stopping the agent");
        self.client_open = false;
    }

    /// The agent's output ended (or could not be read). An agent without a process has then ended.
    pub fn agent_output_ended(&mut self, _now: Instant) {
        self.agent_open = false;
        if !self.has_process && self.exited.is_none() {
            self.exited = Some(ExitStatus::from_raw(0));
        }
    }

    /// The agent's process exited: what it left in its group (a grandchild holding the pipes), and what it
    /// started elsewhere and was marked when the session ended, goes with it; its last output is read until
    /// the drain deadline.
    pub fn process_exited(&mut self, status: ExitStatus, now: Instant) {
        self.actions.push_back(Action::KillLeftovers);
        self.exited = Some(status);
        self.drain_deadline = Some(now + DRAIN_AFTER_EXIT);
        self.ladder = Ladder::Killed;
    }

    /// When [`Lifecycle::handle_timeout`] is next due, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let drain = self.drain_deadline.filter(|_| self.exited.is_some() && self.agent_open);
        let ladder = match self.ladder {
            Ladder::Stopping(at) | Ladder::Termed(at) => Some(at),
            Ladder::Running | Ladder::Killed => None,
        };
        match (drain, ladder) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs what is due at `now`: the drain deadline, or the ladder's next step.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(at) = self.drain_deadline
            && at <= now
            && self.exited.is_some()
            && self.agent_open
        {
            tracing::warn!("the agent's stdout stayed open after it exited; giving up on its last output");
            self.agent_open = false;
            return;
        }
        match self.ladder {
            Ladder::Stopping(at) if at <= now => {
                self.actions.push_back(Action::DropAgentQueue);
                if self.client_open {
                    tracing::warn!("the client left input unread that the agent could not take; not read");
                    self.client_open = false;
                }
                tracing::info!("agent still running {STDIN_GRACE:?} after the client left; sending SIGTERM");
                self.actions.push_back(Action::Terminate);
                if self.agent_stdin {
                    self.close_agent_stdin();
                }
                self.ladder = Ladder::Termed(now + TERM_GRACE);
            }
            Ladder::Termed(at) if at <= now => {
                tracing::warn!("agent ignored SIGTERM for {TERM_GRACE:?}; sending SIGKILL");
                self.actions.push_back(Action::KillAll);
                self.ladder = Ladder::Killed;
            }
            _ => {}
        }
    }

    fn close_agent_stdin(&mut self) {
        self.agent_stdin = false;
        self.actions.push_back(Action::CloseAgentStdin);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::child::exit_code;
    use Action::*;

    /// A virtual clock: the tests move it; nothing sleeps.
    struct Clock(Instant);
    impl Clock {
        fn at(&self, secs: f64) -> Instant {
            self.0 + Duration::from_secs_f64(secs)
        }
    }

    fn clock() -> Clock {
        Clock(Instant::now())
    }

    fn actions(lc: &mut Lifecycle) -> Vec<Action> {
        std::iter::from_fn(|| lc.poll_action()).collect()
    }

    const KILLED: i32 = 9;
    const TERMED: i32 = 15;

    /// What the relay loop does before each wait, and what it is told.
    fn wait(lc: &mut Lifecycle, now: Instant, agent_queue_empty: bool) -> Vec<Action> {
        lc.before_wait(now, agent_queue_empty);
        actions(lc)
    }

    /// The loop's timer arm: sleeps until the lifecycle's deadline (checked to be `at`) and hands it in.
    fn timer(lc: &mut Lifecycle, at: Instant) -> Vec<Action> {
        assert_eq!(lc.poll_timeout(), Some(at), "the next deadline");
        lc.handle_timeout(at);
        actions(lc)
    }

    #[test]
    fn a_child_that_ignores_eof_and_sigterm_gets_sigkill_7_s_after_the_client_left() {
        // The rule behind tests/relay.rs `shutdown_ladder_leaves_no_process_of_the_group`, on a virtual clock.
        let t = clock();
        let mut lc = Lifecycle::new(true);
        assert_eq!(wait(&mut lc, t.at(0.0), true), []);
        assert_eq!(lc.poll_timeout(), None, "nothing is due while both peers are there");
        lc.client_input_ended(t.at(1.0));
        assert_eq!(wait(&mut lc, t.at(1.0), true), [CloseAgentStdin], "nothing queued: its stdin closes at once");
        assert!(!lc.reads_client());
        // A wake-up before the deadline (another arm of the loop) changes nothing.
        lc.handle_timeout(t.at(5.9));
        assert_eq!(actions(&mut lc), []);
        assert_eq!(wait(&mut lc, t.at(5.9), true), [], "the ladder does not start again");
        assert_eq!(timer(&mut lc, t.at(6.0)), [DropAgentQueue, Terminate], "SIGTERM 5 s after the client left");
        assert_eq!(wait(&mut lc, t.at(6.0), true), []);
        assert_eq!(timer(&mut lc, t.at(8.0)), [KillAll], "SIGKILL 2 s after SIGTERM");
        assert_eq!(lc.poll_timeout(), None, "nothing more to send");
        assert!(lc.awaits_exit() && lc.finished().is_none());
        lc.process_exited(ExitStatus::from_raw(KILLED), t.at(8.01));
        assert_eq!(actions(&mut lc), [KillLeftovers]);
        assert!(!lc.awaits_exit());
        assert_eq!(lc.finished(), None, "its last output is still read");
        lc.agent_output_ended(t.at(8.02));
        assert_eq!(lc.finished().map(exit_code), Some(128 + 9));
    }

    #[test]
    fn the_ladder_never_waits_on_a_queue_the_agent_does_not_drain() {
        // The rule behind `a_client_that_closes_while_the_agent_reads_nothing_still_ends_the_session`.
        let t = clock();
        let mut lc = Lifecycle::new(true);
        lc.client_input_ended(t.at(0.0));
        for s in [0.0, 1.0, 4.99] {
            assert_eq!(wait(&mut lc, t.at(s), false), [], "its stdin stays open while frames wait for it");
        }
        assert_eq!(
            timer(&mut lc, t.at(5.0)),
            [DropAgentQueue, Terminate, CloseAgentStdin],
            "what it holds is dropped, SIGTERM, and its stdin closed"
        );
        assert_eq!(wait(&mut lc, t.at(5.0), true), [], "its stdin is closed once");
        lc.process_exited(ExitStatus::from_raw(TERMED), t.at(5.1));
        assert_eq!(actions(&mut lc), [KillLeftovers]);
        lc.agent_output_ended(t.at(5.1));
        assert_eq!(lc.finished().map(exit_code), Some(128 + 15));
    }

    #[test]
    fn a_client_that_stops_reading_starts_the_ladder_whatever_is_queued() {
        let t = clock();
        let mut lc = Lifecycle::new(true);
        lc.client_stopped_reading(t.at(2.0));
        assert!(!lc.reads_client());
        assert_eq!(wait(&mut lc, t.at(2.0), false), []);
        assert_eq!(timer(&mut lc, t.at(7.0)), [DropAgentQueue, Terminate, CloseAgentStdin]);
        assert_eq!(timer(&mut lc, t.at(9.0)), [KillAll]);
    }

    #[test]
    fn a_client_that_hangs_up_with_input_unread_is_read_until_sigterm() {
        let t = clock();
        let mut lc = Lifecycle::new(true);
        lc.client_hung_up(t.at(0.5));
        assert_eq!(wait(&mut lc, t.at(0.5), true), [], "its input is still read: the agent's stdin stays open");
        assert!(lc.reads_client());
        lc.client_hung_up(t.at(1.0));
        assert_eq!(wait(&mut lc, t.at(1.0), true), [], "a second hang-up moves nothing");
        assert_eq!(timer(&mut lc, t.at(5.5)), [DropAgentQueue, Terminate, CloseAgentStdin]);
        assert!(!lc.reads_client(), "what it left unread is not read");
        assert_eq!(timer(&mut lc, t.at(7.5)), [KillAll]);
    }

    #[test]
    fn the_client_reaching_eof_after_its_hang_up_closes_the_agents_stdin_on_the_same_ladder() {
        let t = clock();
        let mut lc = Lifecycle::new(true);
        lc.client_hung_up(t.at(0.0));
        assert_eq!(wait(&mut lc, t.at(0.0), true), []);
        lc.client_input_ended(t.at(1.0));
        assert_eq!(wait(&mut lc, t.at(1.0), true), [CloseAgentStdin]);
        assert_eq!(timer(&mut lc, t.at(5.0)), [DropAgentQueue, Terminate], "the deadline set at the hang-up");
    }

    #[test]
    fn a_signal_stops_the_agent_as_the_client_leaving_does() {
        // The rule behind `sigterm_sigint_or_sighup_to_the_shim_stops_an_agent_that_reads_nothing`.
        for name in ["SIGTERM", "SIGINT", "SIGHUP"] {
            let t = clock();
            let mut lc = Lifecycle::new(true);
            lc.signal(name, t.at(3.0));
            assert!(!lc.reads_client(), "{name}");
            assert_eq!(wait(&mut lc, t.at(3.0), false), [], "{name}");
            assert_eq!(timer(&mut lc, t.at(8.0)), [DropAgentQueue, Terminate, CloseAgentStdin], "{name}");
        }
    }

    #[test]
    fn a_signal_during_the_ladder_moves_no_deadline() {
        let t = clock();
        let mut lc = Lifecycle::new(true);
        lc.client_input_ended(t.at(0.0));
        assert_eq!(wait(&mut lc, t.at(0.0), true), [CloseAgentStdin]);
        lc.signal("SIGTERM", t.at(3.0));
        assert_eq!(wait(&mut lc, t.at(3.0), true), []);
        assert_eq!(timer(&mut lc, t.at(5.0)), [DropAgentQueue, Terminate]);
        lc.signal("SIGINT", t.at(6.0));
        assert_eq!(wait(&mut lc, t.at(6.0), true), []);
        assert_eq!(timer(&mut lc, t.at(7.0)), [KillAll]);
        lc.signal("SIGHUP", t.at(7.5));
        assert_eq!(wait(&mut lc, t.at(7.5), true), []);
        assert_eq!(lc.poll_timeout(), None);
    }

    #[test]
    fn a_cooperative_child_ends_at_the_first_step_with_its_own_status() {
        // The rule behind `sigterm_to_the_shim_stops_a_cooperative_child_quickly`.
        let t = clock();
        let mut lc = Lifecycle::new(true);
        lc.signal("SIGTERM", t.at(0.0));
        assert_eq!(wait(&mut lc, t.at(0.0), true), [CloseAgentStdin]);
        lc.agent_output_ended(t.at(0.1));
        assert_eq!(lc.finished(), None, "its process has not exited yet");
        lc.process_exited(ExitStatus::from_raw(0), t.at(0.2));
        assert_eq!(actions(&mut lc), [KillLeftovers]);
        assert_eq!(lc.poll_timeout(), None, "no ladder step after the exit, and its output has ended");
        assert_eq!(lc.finished().map(exit_code), Some(0));
    }

    #[test]
    fn an_exit_after_the_client_left_ends_the_ladder_and_drains_its_output_for_2_s() {
        let t = clock();
        let mut lc = Lifecycle::new(true);
        lc.client_input_ended(t.at(0.0));
        assert_eq!(wait(&mut lc, t.at(0.0), true), [CloseAgentStdin]);
        lc.process_exited(ExitStatus::from_raw(3 << 8), t.at(1.0));
        assert_eq!(actions(&mut lc), [KillLeftovers]);
        assert_eq!(wait(&mut lc, t.at(1.0), true), []);
        // A grandchild holds the agent's stdout open: its last output is waited for 2 s, not the ladder's 5.
        lc.handle_timeout(t.at(2.9));
        assert!(lc.reads_agent() && lc.finished().is_none());
        assert_eq!(timer(&mut lc, t.at(3.0)), [], "no SIGTERM after the exit");
        assert!(!lc.reads_agent());
        assert_eq!(lc.finished().map(exit_code), Some(3));
        assert_eq!(lc.poll_timeout(), None);
    }

    #[test]
    fn an_exit_before_the_client_left_starts_no_ladder() {
        let t = clock();
        let mut lc = Lifecycle::new(true);
        lc.process_exited(ExitStatus::from_raw(1 << 8), t.at(0.0));
        assert_eq!(actions(&mut lc), [KillLeftovers]);
        assert!(lc.reads_client(), "the client is still read while the agent's last output is");
        assert_eq!(lc.poll_timeout(), Some(t.at(2.0)), "only the drain deadline");
        lc.client_input_ended(t.at(0.5));
        assert_eq!(wait(&mut lc, t.at(0.5), true), [CloseAgentStdin], "the agent's stdin closes; no ladder");
        assert_eq!(lc.poll_timeout(), Some(t.at(2.0)));
        lc.agent_output_ended(t.at(0.6));
        assert_eq!(lc.poll_timeout(), None);
        assert_eq!(lc.finished().map(exit_code), Some(1));
    }

    #[test]
    fn an_agent_that_closes_its_stdin_starts_the_ladder_while_the_client_is_there() {
        let t = clock();
        let mut lc = Lifecycle::new(true);
        lc.agent_stopped_reading(t.at(0.0));
        assert_eq!(wait(&mut lc, t.at(0.0), true), [], "its stdin is already gone");
        assert!(lc.reads_client());
        assert_eq!(timer(&mut lc, t.at(5.0)), [DropAgentQueue, Terminate], "no second close of its stdin");
        assert!(!lc.reads_client());
        assert_eq!(timer(&mut lc, t.at(7.0)), [KillAll]);
    }

    #[test]
    fn an_agent_without_a_process_ends_with_its_output_and_status_0() {
        let t = clock();
        let mut lc = Lifecycle::new(false);
        lc.client_input_ended(t.at(0.0));
        assert_eq!(wait(&mut lc, t.at(0.0), true), [CloseAgentStdin]);
        lc.agent_output_ended(t.at(0.1));
        assert_eq!(lc.finished().map(exit_code), Some(0));
        // With a process, the output ending is not the end.
        let mut lc = Lifecycle::new(true);
        lc.agent_output_ended(t.at(0.1));
        assert_eq!(lc.finished(), None);
        assert!(lc.awaits_exit());
    }
}
