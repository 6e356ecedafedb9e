//! The graph walks `RealDriver` makes for the engine: a graph's nodes,
//! its allocation nodes' bytes and its kernel nodes, child graphs
//! included, through the typed slots of `hooks.rs`.

use std::ffi::{c_int, c_void};
use std::ptr;

use super::hooks::calls as c;
use crate::ffi::*;

/// A handle the engine keeps as a `usize`, as the pointer the driver takes.
pub(super) fn handle(p: usize) -> *mut c_void {
    ptr::with_exposed_provenance_mut(p)
}

/// Child graphs deeper than this are not looked into (the driver's own
/// nesting is far shallower).
const GRAPH_DEPTH: u32 = 16;
/// A graph the driver says has more nodes than this is not looked into (a
/// count that large is not a real graph's, and its array is not made).
const GRAPH_NODES: usize = 1 << 22;

/// The nodes of `graph` (`cuGraphGetNodes`), or `None` when the driver
/// will not say.
pub(super) fn graph_nodes(graph: usize) -> Option<Vec<CUgraphNode>> {
    let mut count: usize = 0;
    // SAFETY: a null node array asks for the count only.
    let rc = unsafe { c::cuGraphGetNodes::call(handle(graph), ptr::null_mut(), &mut count) };
    if rc != CUDA_SUCCESS || count > GRAPH_NODES {
        return None;
    }
    let mut nodes: Vec<CUgraphNode> = vec![ptr::null_mut(); count];
    // SAFETY: the array holds `count` nodes.
    let rc = unsafe { c::cuGraphGetNodes::call(handle(graph), nodes.as_mut_ptr(), &mut count) };
    if rc != CUDA_SUCCESS {
        return None;
    }
    nodes.truncate(count);
    Some(nodes)
}

/// [`Driver::graph_alloc_bytes`] at nesting `depth`.
pub(super) fn graph_bytes(graph: usize, round: u64, depth: u32) -> Option<u64> {
    if depth > GRAPH_DEPTH {
        return None;
    }
    let mut total: u64 = 0;
    for node in graph_nodes(graph)? {
        let mut kind: c_int = 0;
        // SAFETY: a node of the graph and a local out-pointer.
        if unsafe { c::cuGraphNodeGetType::call(node, &mut kind) } != CUDA_SUCCESS {
            return None;
        }
        let bytes = match kind {
            CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                // SAFETY: zero is a valid value of these plain fields.
                let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: an allocation node and a local out-pointer.
                if unsafe { c::cuGraphMemAllocNodeGetParams::call(node, &mut p) } != CUDA_SUCCESS {
                    return None;
                }
                (p.bytesize as u64).checked_next_multiple_of(round.max(1))?
            }
            CU_GRAPH_NODE_TYPE_GRAPH => {
                let mut child: CUgraph = ptr::null_mut();
                // SAFETY: a child-graph node and a local out-pointer.
                if unsafe { c::cuGraphChildGraphNodeGetGraph::call(node, &mut child) }
                    != CUDA_SUCCESS
                {
                    return None;
                }
                graph_bytes(child as usize, round, depth + 1)?
            }
            _ => 0,
        };
        total = total.checked_add(bytes)?;
    }
    Some(total)
}

/// [`Driver::graph_kernels`] at nesting `depth`.
pub(super) fn graph_kernels_at(
    graph: usize,
    depth: u32,
    visit: &mut dyn FnMut(usize, *mut *mut c_void, *mut *mut c_void),
) -> bool {
    if depth > GRAPH_DEPTH {
        return false;
    }
    let Some(nodes) = graph_nodes(graph) else {
        return false;
    };
    let mut all = true;
    for node in nodes {
        let mut kind: c_int = 0;
        // SAFETY: a node of the graph and a local out-pointer.
        if unsafe { c::cuGraphNodeGetType::call(node, &mut kind) } != CUDA_SUCCESS {
            all = false;
            continue;
        }
        match kind {
            CU_GRAPH_NODE_TYPE_KERNEL => {
                // SAFETY: zero is a valid value of these plain fields.
                let mut p: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: a kernel node and a local out-pointer to the v2
                // structure (v1 writes a prefix of it).
                let mut rc = unsafe { c::cuGraphKernelNodeGetParams_v2::call(node, &mut p) };
                if rc == CUDA_ERROR_NOT_FOUND {
                    // SAFETY: as above.
                    rc = unsafe { c::cuGraphKernelNodeGetParams::call(node, &mut p) };
                }
                if rc != CUDA_SUCCESS {
                    all = false;
                    continue;
                }
                let func = if p.func.is_null() { p.kern } else { p.func };
                visit(func as usize, p.kernel_params, p.extra);
            }
            CU_GRAPH_NODE_TYPE_GRAPH => {
                let mut child: CUgraph = ptr::null_mut();
                // SAFETY: a child-graph node and a local out-pointer.
                if unsafe { c::cuGraphChildGraphNodeGetGraph::call(node, &mut child) }
                    != CUDA_SUCCESS
                {
                    all = false;
                    continue;
                }
                all &= graph_kernels_at(child as usize, depth + 1, visit);
            }
            // Its bodies are not read.
            CU_GRAPH_NODE_TYPE_CONDITIONAL => all = false,
            _ => {}
        }
    }
    all
}
