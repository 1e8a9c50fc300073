//! In-process state per name, alive while anybody holds it (weakly mapped, swept as it grows):
//! the cache keeps each entry's `Flight` (its waiters' gate and the value last read) here, the
//! waiting code each primitive's `Gate`. `Locals` holds one such map per kind of state, so that
//! the connection container keeps them without knowing any primitive.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Live gate counts below which the map is not swept for dead entries.
const SWEEP_FLOOR: usize = 64;

pub struct NameMap<T> {
    inner: Mutex<GateMap<T>>,
}

struct GateMap<T> {
    gates: HashMap<Vec<u8>, Weak<T>>,
    /// Sweep dead entries when the map reaches this size (twice the live count after a sweep),
    /// so that many live gates do not make every insert scan the map.
    sweep_at: usize,
}

impl<T: Default> NameMap<T> {
    pub fn new() -> Self {
        NameMap {
            inner: Mutex::new(GateMap {
                gates: HashMap::new(),
                sweep_at: SWEEP_FLOOR,
            }),
        }
    }

    /// The state of `name`, created (with `T::default()`) when nobody holds it.
    pub fn get(&self, name: &[u8]) -> Arc<T> {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(gate) = map.gates.get(name).and_then(Weak::upgrade) {
            return gate;
        }
        if map.gates.len() >= map.sweep_at {
            map.gates.retain(|_, gate| gate.strong_count() > 0);
            map.sweep_at = (map.gates.len() * 2).max(SWEEP_FLOOR);
        }
        let gate = Arc::new(T::default());
        map.gates.insert(name.to_vec(), Arc::downgrade(&gate));
        gate
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gates
            .len()
    }
}

impl<T: Default> Default for NameMap<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// One `NameMap` per type of state, looked up by type: a primitive's in-process state lives
/// beside the connections (one per process and deployment) without their code naming it.
#[derive(Default)]
pub struct Locals {
    maps: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Locals {
    /// The `T` of `name` (see `NameMap::get`).
    pub fn get<T: Default + Send + Sync + 'static>(&self, name: &[u8]) -> Arc<T> {
        let map = {
            let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
            maps.entry(TypeId::of::<T>())
                .or_insert_with(|| Arc::new(NameMap::<T>::new()))
                .clone()
        };
        match map.downcast::<NameMap<T>>() {
            Ok(map) => map.get(name),
            // Never: the entry of `TypeId::of::<T>()` is a `NameMap<T>`.
            Err(_) => Arc::new(T::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gate_per_live_name() {
        let gates: NameMap<u32> = NameMap::new();
        let a = gates.get(b"a");
        let again = gates.get(b"a");
        assert!(Arc::ptr_eq(&a, &again));
        let b = gates.get(b"b");
        assert!(!Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn dead_gates_are_swept() {
        let gates: NameMap<()> = NameMap::new();
        let keep = gates.get(b"keep");
        for i in 0..1000u32 {
            drop(gates.get(&i.to_be_bytes()));
        }
        assert!(gates.len() <= SWEEP_FLOOR + 1, "{}", gates.len());
        assert!(Arc::ptr_eq(&keep, &gates.get(b"keep")));
    }

    #[test]
    fn locals_keep_one_map_per_type() {
        let locals = Locals::default();
        let a = locals.get::<u32>(b"a");
        assert!(Arc::ptr_eq(&a, &locals.get::<u32>(b"a")));
        let counter = locals.get::<Mutex<u64>>(b"a");
        *counter.lock().unwrap() = 7;
        assert_eq!(*locals.get::<Mutex<u64>>(b"a").lock().unwrap(), 7);
        assert_eq!(*locals.get::<u64>(b"a"), 0);
        assert_eq!(*a, 0);
    }
}
