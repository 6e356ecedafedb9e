//! A page's mailboxes, written once for every asker (`vramcap trim`,
//! `limit`, `park`/`resume`, and parking's policy in another capped
//! process) and every answerer (the shim's background thread).
//!
//! Each mailbox is two words of the page's header: a request counter the
//! askers raise ([`Mailbox::ask`], whose new value is the request's
//! ticket) and an acknowledgement the answerer sets to the counter it
//! read ([`Mailbox::pending`], then [`Mailbox::answer`] once every word
//! of the answer is written): a request is answered once the
//! acknowledgement reaches its ticket ([`Mailbox::answered`], wrap-safe).
//! What is asked goes in other words before the counter is raised (the
//! `requested` cap of a slot for `limit`; [`post_park`]'s ask word for
//! parking), and the answer's words are written before the
//! acknowledgement (Release/Acquire on both words orders them).
//!
//! Parking's ask word is also how a request is taken and withdrawn: the
//! answerer takes it by swapping it to 0 ([`take_park`]), and an asker
//! that gave up waiting swaps its own ask back to 0 ([`withdraw_park`]):
//! exactly one of the two sees it, so a request is either acted on or
//! withdrawn, never acted on after its asker gave up without knowing.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::page::{Header, acknowledged};
use crate::park::Ask;

/// One mailbox of a page: its request counter and acknowledgement.
#[derive(Clone, Copy)]
pub struct Mailbox<'a> {
    requests: &'a AtomicU64,
    acks: &'a AtomicU64,
}

impl<'a> Mailbox<'a> {
    /// `vramcap trim`'s: release the cache.
    pub fn trim(h: &'a Header) -> Mailbox<'a> {
        Mailbox {
            requests: &h.trim_requests,
            acks: &h.trim_acks,
        }
    }

    /// `vramcap limit`'s: apply the slots' `requested` caps.
    pub fn limit(h: &'a Header) -> Mailbox<'a> {
        Mailbox {
            requests: &h.limit_requests,
            acks: &h.limit_acks,
        }
    }

    /// Parking's: the ask word says what ([`post_park`]).
    pub fn park(h: &'a Header) -> Mailbox<'a> {
        Mailbox {
            requests: &h.park_requests,
            acks: &h.park_acks,
        }
    }

    /// The asker's side: raises the counter; the request's ticket.
    pub fn ask(self) -> u64 {
        self.requests.fetch_add(1, Ordering::AcqRel).wrapping_add(1)
    }

    /// The asker's side: whether the request with `ticket` was answered.
    pub fn answered(self, ticket: u64) -> bool {
        acknowledged(self.acks.load(Ordering::Acquire), ticket)
    }

    /// The answerer's side: the counter when a request is unanswered (to
    /// pass to [`Mailbox::answer`] once the answer is written).
    pub fn pending(self) -> Option<u64> {
        let asked = self.requests.load(Ordering::Acquire);
        (asked != self.acks.load(Ordering::Acquire)).then_some(asked)
    }

    /// The answerer's side: acknowledges every request up to `asked`.
    pub fn answer(self, asked: u64) {
        self.acks.store(asked, Ordering::Release);
    }
}

/// Posts `ask` in the park mailbox of `h`: the ask word, then the
/// counter; the ticket.
pub fn post_park(h: &Header, ask: Ask) -> u64 {
    h.park_ask.store(ask as u64, Ordering::Release);
    Mailbox::park(h).ask()
}

/// The answerer takes what was asked (the word swapped to 0): `None` when
/// nothing is asked (withdrawn, or a word it does not know).
pub fn take_park(h: &Header) -> Option<Ask> {
    Ask::from_word(h.park_ask.swap(0, Ordering::AcqRel))
}

/// The asker withdraws its `ask` if the answerer has not taken it yet:
/// true when withdrawn (it will not be acted on).
pub fn withdraw_park(h: &Header, ask: Ask) -> bool {
    h.park_ask
        .compare_exchange(ask as u64, 0, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::Page;

    fn page() -> Box<Page> {
        // SAFETY: all-zero bytes are a valid Page (integers and atomics).
        unsafe { Box::new_zeroed().assume_init() }
    }

    #[test]
    fn a_request_is_answered_once_acknowledged_and_not_before() {
        let p = page();
        let m = Mailbox::trim(&p.header);
        assert_eq!(m.pending(), None);
        let t1 = m.ask();
        let t2 = m.ask();
        assert!(!m.answered(t1) && !m.answered(t2));
        let asked = m.pending().expect("pending");
        m.answer(asked);
        assert!(m.answered(t1) && m.answered(t2));
        assert_eq!(m.pending(), None);
        // The mailboxes are separate words.
        assert_eq!(Mailbox::limit(&p.header).pending(), None);
    }

    #[test]
    fn the_counter_wraps_and_a_ticket_of_zero_is_still_waited_for() {
        let p = page();
        p.header.limit_requests.store(u64::MAX, Ordering::Relaxed);
        p.header.limit_acks.store(u64::MAX, Ordering::Relaxed);
        let m = Mailbox::limit(&p.header);
        let t = m.ask();
        assert_eq!(t, 0);
        assert!(!m.answered(t));
        m.answer(m.pending().unwrap());
        assert!(m.answered(t));
    }

    #[test]
    fn a_park_ask_is_taken_or_withdrawn_never_both() {
        let p = page();
        let h = &p.header;
        post_park(h, Ask::ParkIfIdle);
        assert!(withdraw_park(h, Ask::ParkIfIdle));
        assert_eq!(take_park(h), None);
        post_park(h, Ask::Park);
        assert_eq!(take_park(h), Some(Ask::Park));
        assert!(!withdraw_park(h, Ask::Park));
        assert_eq!(Mailbox::park(h).pending(), Some(2));
    }
}
