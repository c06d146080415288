//! Restarts from the same folders: the state comes back from the Raft log
//! and snapshot, and a torn log tail is dropped.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;

use control::{Command, ControlConfig, Response};

use crate::harness::{cluster, join_all, stream_config, wait_until, Node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_cluster_recovers_its_state_and_views_keep_growing() {
    let root = tempfile::tempdir().expect("temp dir");
    let nodes = cluster(3, &root).await;
    join_all(&nodes).await;
    nodes[1]
        .control
        .propose(Command::CreateStream {
            name: "orders".to_string(),
            config: stream_config(),
        })
        .await
        .expect("create");
    wait_until("every node has the stream", || {
        nodes
            .iter()
            .all(|node| node.state().streams.contains_key("orders"))
    })
    .await;
    let before = nodes[0].state();

    let mut stopped = Vec::new();
    for node in nodes {
        stopped.push((node.id, node.stop().await));
    }
    let voters: BTreeMap<_, _> = stopped
        .iter()
        .map(|(id, (address, _))| (*id, address.clone()))
        .collect();
    let mut nodes = Vec::new();
    for (id, (address, dir)) in stopped {
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .expect("rebind");
        nodes.push(Node::start(id, listener, dir, &voters).await);
    }

    wait_until("every node recovers the state", || {
        nodes.iter().all(|node| {
            let state = node.state();
            state.view == before.view
                && state.members == before.members
                && state.streams == before.streams
        })
    })
    .await;
    let response = nodes[2]
        .control
        .propose(nodes[2].join())
        .await
        .expect("rejoin");
    match response {
        Response::Joined { view } => assert!(view > before.view, "{view} after {}", before.view),
        other => panic!("{other:?}"),
    }
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbled_log_tail_is_dropped_on_restart() {
    let root = tempfile::tempdir().expect("temp dir");
    let nodes = cluster(1, &root).await;
    join_all(&nodes).await;
    for name in ["a", "b", "c"] {
        nodes[0]
            .control
            .propose(Command::CreateStream {
                name: name.to_string(),
                config: stream_config(),
            })
            .await
            .expect("create");
    }
    let before = nodes[0].state();
    let node = nodes.into_iter().next().expect("node");
    let (address, dir) = node.stop().await;

    // What a crash in the middle of an append leaves: part of a record.
    let mut log = OpenOptions::new()
        .append(true)
        .open(dir.join("raft.log"))
        .expect("open the log");
    log.write_all(b"\x40\x00\x00\x00\x12\x34garbage, not a whole record")
        .expect("garble");
    drop(log);

    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .expect("rebind");
    let voters = BTreeMap::from([(1, address.clone())]);
    let node = Node::start_with(ControlConfig::new(1, address, dir), listener, &voters).await;
    wait_until("the node recovers the good prefix", || {
        let state = node.state();
        state.view == before.view && state.streams == before.streams
    })
    .await;
    // It goes on logging after the prefix.
    node.control
        .propose(Command::DeleteStream {
            name: "a".to_string(),
        })
        .await
        .expect("delete");
    assert!(!node.state().streams.contains_key("a"));
    node.stop().await;
}
