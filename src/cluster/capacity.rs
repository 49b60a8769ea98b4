//! GetCapacity in the controller without a round trip per call: each
//! node's capacity state, kept from the node's own `Capacity.Watch` stream
//! (`grpc::cluster`), which sends it after every change. A call is
//! answered here only with what the node itself would answer now:
//!
//! - the same validation (`validate::capacity_ask`, on the node's classes
//!   as the state names them), so the same refusals;
//! - a state no older than the last change the controller saw the node
//!   make: every answer on the channel carries the node's change counter
//!   (`channel::Seen`), and a state behind it is waited for a moment,
//!   then asked of the node;
//! - figures of a report the node still serves without a refresh
//!   (`fresh_for_ms`): past that, the node is asked, as its own
//!   GetCapacity would then refresh.
//!
//! Anything else, a node not watched yet, or a state the node marked
//! unknown, goes to the node as before. A node is watched from the first
//! GetCapacity that names it (a sidecar asked), for as long as its stream
//! lasts; a stream that breaks drops the state, and the next GetCapacity
//! watches again, at most once per [`RETRY`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Status;

use super::nodes::Node;
use crate::grpc::controller::capacity_elsewhere;
use crate::grpc::validate::{self, CapacityAsk, ClassShape};
use crate::proto::csi::v1::{GetCapacityRequest, GetCapacityResponse};
use crate::proto::thinpool::cluster::v1::capacity_client::CapacityClient;
use crate::proto::thinpool::cluster::v1::{CapacityState, WatchCapacityRequest};

/// How long a call waits for a state that catches up with a change the
/// controller saw, before it asks the node.
const CATCH_UP: Duration = Duration::from_millis(200);

/// How soon a node whose stream failed or broke is watched again.
const RETRY: Duration = Duration::from_secs(5);

/// The kept states, by node key.
#[derive(Default)]
pub struct Kept {
    entries: Mutex<HashMap<String, Entry>>,
    /// Bumped at every state received.
    updated: tokio::sync::watch::Sender<u64>,
}

struct Entry {
    /// The node watched: a node replaced in the list (another address)
    /// is another, and watched anew.
    node: Arc<Node>,
    /// The last state and when it came.
    state: Option<(CapacityState, Instant)>,
    /// When the stream last failed or ended (then no state).
    failed: Option<Instant>,
    task: tokio::task::AbortHandle,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kept {
    /// GetCapacity's answer for `req` on `node` from its kept state, or
    /// `None` when the node must be asked.
    pub async fn answer(
        &self,
        node: &Arc<Node>,
        req: &GetCapacityRequest,
    ) -> Option<Result<GetCapacityResponse, Status>> {
        let mut updated = self.updated.subscribe();
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        loop {
            updated.borrow_and_update();
            match self.current(node) {
                State::Usable(state, at) => return answer_from(&state, at, req),
                State::None => return None,
                State::Behind => {}
            }
            if tokio::time::timeout_at(deadline, updated.changed())
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    /// The state kept for `node`, and whether it holds every change the
    /// controller saw.
    fn current(&self, node: &Arc<Node>) -> State {
        let entries = self.entries.lock().unwrap();
        let Some(e) = entries
            .get(&node.key)
            .filter(|e| Arc::ptr_eq(&e.node, node))
        else {
            return State::None;
        };
        match &e.state {
            None => State::None,
            Some((s, _)) if s.generation < node.seen.load(Ordering::SeqCst) => State::Behind,
            Some((s, at)) => State::Usable(s.clone(), *at),
        }
    }

    /// Starts watching `node`, unless it is watched already or its
    /// stream failed less than [`RETRY`] ago.
    pub fn watch(self: &Arc<Self>, node: &Arc<Node>) {
        let mut entries = self.entries.lock().unwrap();
        if let Some(e) = entries.get(&node.key) {
            let recent = e.failed.is_none_or(|f| f.elapsed() < RETRY);
            if Arc::ptr_eq(&e.node, node) && recent {
                return;
            }
        }
        let task = tokio::spawn(self.clone().keep(node.clone())).abort_handle();
        entries.insert(
            node.key.clone(),
            Entry {
                node: node.clone(),
                state: None,
                failed: None,
                task,
            },
        );
    }

    /// Whether the node of key `key` has a state kept that holds every
    /// change seen and knows every class.
    pub fn holds(&self, key: &str) -> bool {
        self.entries.lock().unwrap().get(key).is_some_and(|e| {
            e.state.as_ref().is_some_and(|(s, _)| {
                s.generation >= e.node.seen.load(Ordering::SeqCst)
                    && s.classes.iter().all(|c| c.known)
            })
        })
    }

    /// Forgets `node`'s state (it did not answer a call).
    pub fn forget(&self, node: &Node) {
        let mut entries = self.entries.lock().unwrap();
        let watched = |e: &&mut Entry| std::ptr::eq(Arc::as_ptr(&e.node), node);
        if let Some(e) = entries.get_mut(&node.key).filter(watched) {
            e.state = None;
            e.failed = Some(Instant::now());
        }
    }

    /// The watch of `node`: each state it sends is kept, until the stream
    /// fails or ends.
    async fn keep(self: Arc<Self>, node: Arc<Node>) {
        let mut client = CapacityClient::new(node.channel.clone());
        let why = match client.watch(WatchCapacityRequest {}).await {
            Ok(r) => {
                let mut stream = r.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(state)) => self.keep_state(&node, state),
                        Ok(None) => break "the node ended the stream".to_string(),
                        Err(e) => break e.message().to_string(),
                    }
                }
            }
            Err(e) => e.message().to_string(),
        };
        tracing::info!(
            node = node.id,
            reason = why,
            "capacity: not watching the node; its GetCapacity calls go to it"
        );
        self.forget(&node);
    }

    fn keep_state(&self, node: &Arc<Node>, state: CapacityState) {
        let mut entries = self.entries.lock().unwrap();
        if let Some(e) = entries
            .get_mut(&node.key)
            .filter(|e| Arc::ptr_eq(&e.node, node))
        {
            e.state = Some((state, Instant::now()));
            e.failed = None;
        }
        drop(entries);
        self.updated.send_modify(|n| *n += 1);
    }
}

enum State {
    None,
    Behind,
    Usable(CapacityState, Instant),
}

/// GetCapacity's answer for `req` from `state` (received at `at`), as the
/// node would give it; `None` when the node must be asked.
fn answer_from(
    state: &CapacityState,
    at: Instant,
    req: &GetCapacityRequest,
) -> Option<Result<GetCapacityResponse, Status>> {
    if state.driver_version != env!("CARGO_PKG_VERSION") {
        return None;
    }
    let shapes: Vec<ClassShape> = state
        .classes
        .iter()
        .map(|c| ClassShape {
            name: &c.name,
            vg: &c.volume_group,
            pool: &c.thin_pool,
            default_fs_type: &c.default_fs_type,
        })
        .collect();
    let ask = validate::capacity_ask(
        req,
        &shapes,
        state.default_class as usize,
        &state.topology_key,
        &state.node_id,
    );
    let i = match ask {
        Err(e) => return Some(Err(e.into())),
        Ok(CapacityAsk::Elsewhere) => return Some(Ok(capacity_elsewhere())),
        Ok(CapacityAsk::Class(i)) => i,
    };
    let c = state.classes.get(i)?;
    if !c.known || at.elapsed() >= Duration::from_millis(c.fresh_for_ms) {
        return None;
    }
    Some(Ok(GetCapacityResponse {
        available_capacity: c.available_capacity,
        maximum_volume_size: Some(c.maximum_volume_size),
        minimum_volume_size: Some(c.minimum_volume_size),
    }))
}
