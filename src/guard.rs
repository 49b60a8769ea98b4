//! The per-volume in-flight guard: one operation per volume at a time. A
//! second call for a volume that is busy gets ABORTED at once, as the CSI
//! spec asks ("operation pending for volume"), instead of queueing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

#[derive(Default, Clone)]
pub struct InFlight {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Holds a volume busy until dropped.
pub struct Held {
    busy: Arc<Mutex<HashSet<String>>>,
    key: String,
}

impl InFlight {
    pub fn try_hold(&self, key: &str, what: &str) -> Result<Held> {
        let mut set = self.busy.lock().unwrap();
        if !set.insert(key.to_string()) {
            return Err(Error::Aborted(format!(
                "an operation on volume {key} is already in progress; {what} not started"
            )));
        }
        Ok(Held {
            busy: self.busy.clone(),
            key: key.to_string(),
        })
    }

    /// The volumes with an operation running now, sorted.
    pub fn busy(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.busy.lock().unwrap().iter().cloned().collect();
        keys.sort();
        keys
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.busy.lock().unwrap().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_aborted_until_the_first_drops() {
        let f = InFlight::default();
        let a = f.try_hold("v1", "delete").unwrap();
        let e = f.try_hold("v1", "expand").err().unwrap();
        assert!(matches!(e, Error::Aborted(_)));
        assert!(e.to_string().contains("v1") && e.to_string().contains("expand"));
        let _other = f.try_hold("v2", "create").unwrap();
        assert_eq!(f.busy(), ["v1", "v2"]);
        drop(a);
        assert_eq!(f.busy(), ["v2"]);
        f.try_hold("v1", "expand").unwrap();
    }
}
