//! Round bookkeeping, pure: the server requests a call is waiting on (key → upstream id), minting
//! keys, opening a round (the `inputRequests` of an `input_required` result), taking a retry's
//! answers (what to deliver upstream, what to ask again), and what to cancel when the call is
//! abandoned. No IO and no knowledge of the actor: the actor sends what this type decides.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use std::sync::Arc;

use crate::input::{self, Asked, InputKind};
use crate::state::replay;
use result::InputRequests;

mod result;

/// The server requests of one call that wait for the client, across its rounds.
#[derive(Debug, Default)]
pub(super) struct Rounds {
    pending: Vec<Pending>,
    /// Keys minted so far (keys are unique per call: `elicitation-1`, `sampling-2`, …).
    minted: u32,
    /// Rounds opened so far; the current round's number once one is open.
    opened: u32,
    /// The upstream answered -32042: once its URL elicitations are answered, the original request
    /// must be sent again.
    reissue: bool,
}

/// A server request waiting for the client's answer.
#[derive(Debug)]
struct Pending {
    /// Its key, what it asks and how an answer is checked.
    asked: Asked,
    /// Raw JSON id of the upstream request; `None` for a URL elicitation made from -32042, which
    /// is answered by re-issuing the call rather than by a response.
    upstream_id: Option<String>,
    /// The modern embedded request the client sees, as text: a parked call keeps it for as
    /// long as it waits, and a tree of it was a few B-tree nodes (3 KB for a small form).
    embedded: Box<RawValue>,
    /// URL-mode `elicitationId`: removed from what the client sees (2026-07-28 has none), kept
    /// to recognise the upstream's `notifications/elicitation/complete`.
    elicitation_id: Option<String>,
    /// What the request asks, for replay (see `replay::fingerprint`); only when the call keeps
    /// a journal (its tokens or its task carry one), which nothing else reads.
    fingerprint: Option<String>,
    /// Listed on the task the call became (each request is listed once).
    listed: bool,
}

/// One round, ready to send: its number and its keys with their kinds (for answer validation).
/// What it asks is the pending requests ([`Rounds::input_required`]).
#[derive(Debug)]
pub(super) struct Round {
    pub(super) number: u32,
    pub(super) keys: Arc<[Asked]>,
}

/// What a retry's answers mean for the upstream.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Answered {
    /// Responses to send upstream, in the order the requests arrived: (upstream id, result).
    pub(super) deliveries: Vec<(String, Value)>,
    /// Every URL elicitation of a -32042 is answered: send the original request again.
    pub(super) reissue: bool,
    /// The answers given, each with the fingerprint of the request it answers (the journal a
    /// replay-safe call's next token carries).
    pub(super) journal: Vec<(String, Value)>,
}

/// A request to abandon: its upstream id and kind (which picks the cancel answer).
pub(super) type Abandoned = (String, InputKind);

impl Rounds {
    /// A call run again as a task that minted `minted` keys already: its keys come after them
    /// (a key is never reused over a task's life).
    pub(super) fn after(minted: u32) -> Self {
        Self {
            minted,
            ..Self::default()
        }
    }

    /// Whether the upstream request `upstream_id` is already pending (an upstream that sends the
    /// same id twice must not get two answers with that id).
    pub(super) fn is_pending(&self, upstream_id: &str) -> bool {
        self.pending
            .iter()
            .any(|p| p.upstream_id.as_deref() == Some(upstream_id))
    }

    /// Server requests waiting for the client now.
    pub(super) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Adds a server request (or, with no `upstream_id`, a URL elicitation from -32042) and
    /// returns its key; `journaled`: the call keeps a journal, so the request's fingerprint is
    /// taken.
    pub(super) fn ask(
        &mut self,
        kind: InputKind,
        upstream_id: Option<String>,
        params: Option<Value>,
        journaled: bool,
    ) -> &str {
        let schema = input::compile_schema(kind, params.as_ref());
        let fingerprint = journaled.then(|| replay::fingerprint(kind.method(), params.as_ref()));
        let (embedded, elicitation_id) = input::to_embedded(kind, params);
        // A tree of JSON values always writes (`null` stands for the error that cannot come).
        let embedded = crate::jsonrpc::raw(&embedded).unwrap_or_default();
        self.minted += 1;
        if self.pending.is_empty() {
            // A call asks one thing at a time, mostly: not the four places a first push makes.
            self.pending.reserve_exact(1);
        }
        let key = format!("{}-{}", kind.key_prefix(), self.minted);
        self.pending.push(Pending {
            asked: Asked { key, kind, schema },
            upstream_id,
            embedded,
            elicitation_id,
            fingerprint,
            listed: false,
        });
        self.pending.last().map_or("", |p| p.asked.key.as_str())
    }

    /// Adds the URL elicitations of a legacy -32042 error; the call is re-issued once they are
    /// answered.
    pub(super) fn ask_url_elicitations(&mut self, elicitations: &[Value]) {
        // No fingerprints: they are answered by re-issuing the call, never journaled.
        for e in elicitations {
            self.ask(InputKind::Elicitation, None, Some(e.clone()), false);
        }
        self.reissue = !elicitations.is_empty();
    }

    /// Each pending key with the fingerprint of what it asks (a URL elicitation made from
    /// -32042 is left out: it is answered by re-issuing the call, not by a response).
    pub(super) fn fingerprints(&self) -> Vec<(String, String)> {
        self.pending
            .iter()
            .filter(|p| p.upstream_id.is_some())
            .filter_map(|p| Some((p.asked.key.clone(), p.fingerprint.clone()?)))
            .collect()
    }

    /// Whether anything waits for the client.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether a round was ever opened (results after rounds are never cacheable).
    pub(super) fn had_rounds(&self) -> bool {
        self.opened > 0
    }

    /// Rounds opened so far.
    pub(super) fn opened(&self) -> u32 {
        self.opened
    }

    /// Opens the next round over everything pending (keys asked again keep their names).
    pub(super) fn open(&mut self) -> Round {
        self.opened += 1;
        Round {
            number: self.opened,
            keys: self.pending.iter().map(|p| p.asked.clone()).collect(),
        }
    }

    /// The `input_required` result of the round open now (every pending request), signed
    /// `token`, naming the server in `_meta` (every result SHOULD, interim ones too), as JSON
    /// text: written from the pending requests as they are, with no tree built for it.
    pub(super) fn input_required(&self, token: &str, server_info: Option<&RawValue>) -> String {
        result::input_required(self.input_requests(), token, server_info)
    }

    // The `inputRequests` object: each pending request's embedded request by its key.
    fn input_requests(&self) -> InputRequests<'_> {
        InputRequests::new(
            (self.pending.iter())
                .map(|p| (p.asked.key.as_str(), &*p.embedded))
                .collect(),
        )
    }

    /// Takes the answers a retry gave: answered requests leave the pending set (those with an
    /// upstream id become deliveries, the answers moved into them), the others stay to be asked
    /// again. Keys the call did not ask for are ignored.
    pub(super) fn answer(&mut self, mut answers: Map<String, Value>) -> Answered {
        let mut out = Answered::default();
        self.pending.retain(|p| {
            let Some(answer) = answers.remove(&p.asked.key) else {
                return true;
            };
            if let Some(id) = &p.upstream_id {
                if let Some(fp) = &p.fingerprint {
                    out.journal.push((fp.clone(), answer.clone()));
                }
                out.deliveries.push((id.clone(), answer));
            }
            false
        });
        if self.reissue && self.pending.iter().all(|p| p.upstream_id.is_some()) {
            self.reissue = false;
            out.reissue = true;
        }
        out
    }

    /// The journal entries `answers` make (fingerprint, answer) for pending requests with an
    /// upstream id, in the order they were asked; nothing leaves the pending set.
    pub(super) fn journal_of(&self, answers: &Map<String, Value>) -> Vec<(String, Value)> {
        (self.pending.iter())
            .filter(|p| p.upstream_id.is_some())
            .filter_map(|p| Some((p.fingerprint.clone()?, answers.get(&p.asked.key)?.clone())))
            .collect()
    }

    /// Empties the pending set: the upstream requests to answer with a cancellation.
    pub(super) fn abandon(&mut self) -> Vec<Abandoned> {
        self.reissue = false;
        std::mem::take(&mut self.pending)
            .into_iter()
            .filter_map(|p| Some((p.upstream_id?, p.asked.kind)))
            .collect()
    }

    /// The upstream cancelled one of its own requests (`notifications/cancelled`): stop asking.
    /// Returns the key it was asked under, if it was pending.
    pub(super) fn forget(&mut self, upstream_id: &str) -> Option<String> {
        let at = self
            .pending
            .iter()
            .position(|p| p.upstream_id.as_deref() == Some(upstream_id))?;
        Some(self.pending.remove(at).asked.key)
    }

    /// The pending requests a task does not list yet, as it lists them (key, what the client
    /// sees); from now on they count as listed.
    pub(super) fn list(&mut self) -> Vec<(String, Value)> {
        self.pending
            .iter_mut()
            .filter_map(|p| {
                let listed = std::mem::replace(&mut p.listed, true);
                // Text this call wrote from a tree: it reads back.
                (!listed).then(|| {
                    let embedded = serde_json::from_str(p.embedded.get()).unwrap_or(Value::Null);
                    (p.asked.key.clone(), embedded)
                })
            })
            .collect()
    }

    /// Whether `elicitation_id` names a pending URL elicitation.
    pub(super) fn is_pending_url(&self, elicitation_id: &str) -> bool {
        self.pending
            .iter()
            .any(|p| p.elicitation_id.as_deref() == Some(elicitation_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::META_SERVER_INFO;
    use serde_json::json;

    fn elicit(message: &str) -> Value {
        json!({"message": message, "requestedSchema": {"type": "object", "properties": {}}})
    }

    // What the round open now asks, as the client reads it.
    fn input_requests(r: &Rounds) -> Value {
        serde_json::to_value(r.input_requests()).unwrap()
    }

    fn answers(pairs: &[(&str, Value)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn keys_are_unique_per_call_and_name_their_kind() {
        let mut r = Rounds::default();
        assert_eq!(
            r.ask(
                InputKind::Elicitation,
                Some("0".into()),
                Some(elicit("a")),
                true
            ),
            "elicitation-1"
        );
        assert_eq!(
            r.ask(InputKind::Sampling, Some("1".into()), None, true),
            "sampling-2"
        );
        assert_eq!(
            r.ask(InputKind::Roots, Some("2".into()), None, true),
            "roots-3"
        );
        let round = r.open();
        assert_eq!(round.number, 1);
        assert_eq!(
            input_requests(&r)
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["elicitation-1", "roots-3", "sampling-2"]
        );
        assert_eq!(
            input_requests(&r)["roots-3"],
            json!({"method": "roots/list"})
        );
        assert_eq!(round.keys[1].key, "sampling-2");
        assert_eq!(round.keys[1].kind, InputKind::Sampling);
    }

    #[test]
    fn answers_are_delivered_in_arrival_order_and_missing_keys_asked_again() {
        let mut r = Rounds::default();
        r.ask(
            InputKind::Elicitation,
            Some("7".into()),
            Some(elicit("a")),
            true,
        );
        r.ask(
            InputKind::Elicitation,
            Some("\"x\"".into()),
            Some(elicit("b")),
            true,
        );
        r.ask(InputKind::Roots, Some("9".into()), None, true);
        r.open();
        let got = r.answer(answers(&[
            ("roots-3", json!({"roots": []})),
            ("elicitation-1", json!({"action": "decline"})),
            ("unasked-9", json!({})),
        ]));
        assert_eq!(
            got.deliveries,
            vec![
                ("7".to_owned(), json!({"action": "decline"})),
                ("9".to_owned(), json!({"roots": []})),
            ]
        );
        assert!(!got.reissue);
        assert!(r.has_pending());
        let again = r.open();
        assert_eq!(again.number, 2);
        assert_eq!(
            input_requests(&r)
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["elicitation-2"],
            "a key asked again keeps its name"
        );
        let got = r.answer(answers(&[("elicitation-2", json!({"action": "cancel"}))]));
        assert_eq!(got.deliveries.len(), 1);
        assert!(!r.has_pending());
        assert!(r.had_rounds());
    }

    #[test]
    fn url_elicitations_from_32042_reissue_once_all_are_answered() {
        let mut r = Rounds::default();
        let url = |id: &str| json!({"mode": "url", "message": "m", "url": "https://x", "elicitationId": id});
        r.ask_url_elicitations(&[url("e1"), url("e2")]);
        r.open();
        assert!(
            input_requests(&r)["elicitation-1"]["params"]
                .get("elicitationId")
                .is_none(),
            "the legacy id stays proxy-side"
        );
        assert!(r.is_pending_url("e2"));
        let got = r.answer(answers(&[("elicitation-1", json!({"action": "accept"}))]));
        assert_eq!(
            got,
            Answered::default(),
            "nothing to deliver, one still missing"
        );
        let got = r.answer(answers(&[("elicitation-2", json!({"action": "accept"}))]));
        assert!(got.reissue);
        assert!(got.deliveries.is_empty());
        assert!(!r.answer(Map::new()).reissue, "re-issued once");
    }

    #[test]
    fn abandoning_names_only_real_upstream_requests() {
        let mut r = Rounds::default();
        r.ask(InputKind::Sampling, Some("3".into()), None, true);
        r.ask_url_elicitations(&[json!({"mode": "url", "url": "https://x"})]);
        r.ask(
            InputKind::Elicitation,
            Some("4".into()),
            Some(elicit("a")),
            true,
        );
        r.forget("4");
        assert_eq!(r.abandon(), vec![("3".to_owned(), InputKind::Sampling)]);
        assert!(!r.has_pending());
        assert!(r.abandon().is_empty());
    }

    #[test]
    fn only_a_journaled_call_fingerprints_what_it_is_asked() {
        let mut r = Rounds::default();
        r.ask(
            InputKind::Elicitation,
            Some("1".into()),
            Some(elicit("a")),
            false,
        );
        r.ask(
            InputKind::Elicitation,
            Some("2".into()),
            Some(elicit("a")),
            true,
        );
        let fp = replay::fingerprint("elicitation/create", Some(&elicit("a")));
        assert_eq!(
            r.fingerprints(),
            vec![("elicitation-2".to_owned(), fp.clone())]
        );
        let both = answers(&[
            ("elicitation-1", json!({"action": "decline"})),
            ("elicitation-2", json!({"action": "cancel"})),
        ]);
        assert_eq!(
            r.journal_of(&both),
            vec![(fp.clone(), json!({"action": "cancel"}))]
        );
        let got = r.answer(both);
        assert_eq!(got.deliveries.len(), 2, "both go upstream");
        assert_eq!(got.journal, vec![(fp, json!({"action": "cancel"}))]);
    }

    #[test]
    fn a_duplicate_upstream_id_is_recognised() {
        let mut r = Rounds::default();
        r.ask(InputKind::Roots, Some("5".into()), None, true);
        assert!(r.is_pending("5"));
        assert!(!r.is_pending("6"));
        assert_eq!(r.pending(), 1);
    }

    #[test]
    fn the_round_result_names_the_server() {
        let mut r = Rounds::default();
        r.ask(InputKind::Roots, Some("1".into()), None, true);
        r.ask(
            InputKind::Elicitation,
            Some("2".into()),
            Some(elicit("a")),
            true,
        );
        r.open();
        let info = json!({"name": "up", "version": "1"});
        let raw = crate::jsonrpc::raw(&info).unwrap();
        let text = r.input_required("tok", Some(&raw));
        // What a `Value` of the same result is written as, byte for byte (keys in order).
        let expected = json!({
            "resultType": "input_required",
            "inputRequests": {
                "roots-1": {"method": "roots/list"},
                "elicitation-2": {"method": "elicitation/create", "params": elicit("a")},
            },
            "requestState": "tok",
            "_meta": {META_SERVER_INFO: info},
        });
        assert_eq!(text, crate::jsonrpc::text(&expected));
        let v: Value = serde_json::from_str(&r.input_required("tok", None)).unwrap();
        assert_eq!(v["requestState"], "tok");
        assert!(v.get("_meta").is_none());
    }
}
