//! Servers that were not initial voters join through `add_voter`, and a
//! node far behind catches up from a snapshot.

use std::collections::BTreeMap;

use control::{Command, ControlConfig};

use crate::harness::{bind, cluster, join_all, leader, stream_config, wait_until, within, Node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_servers_join_through_add_voter_on_a_follower_or_on_themselves() {
    let root = tempfile::tempdir().expect("temp dir");
    let mut nodes = cluster(3, &root).await;
    join_all(&nodes).await;
    let seeds: BTreeMap<_, _> = nodes
        .iter()
        .map(|node| (node.id, node.address.clone()))
        .collect();

    // Server 4 is added by a follower.
    let listener = bind().await;
    let fourth = Node::start(4, listener, root.path().join("server-4"), &seeds).await;
    let leader_id = leader(&nodes).await;
    let follower = nodes
        .iter()
        .find(|node| node.id != leader_id)
        .expect("follower");
    within(
        "add_voter on a follower",
        follower.control.add_voter(4, fourth.address.clone()),
    )
    .await
    .expect("server 4 added");
    let view = nodes[0].state().view;
    wait_until("server 4 has the replicated state", || {
        fourth.state().view == view && fourth.state().members.len() == 3
    })
    .await;

    // Server 5 asks the voters it knows to add it.
    let listener = bind().await;
    let fifth = Node::start(5, listener, root.path().join("server-5"), &seeds).await;
    within(
        "add_voter on the new server",
        fifth.control.add_voter(5, fifth.address.clone()),
    )
    .await
    .expect("server 5 added");
    assert_eq!(fifth.state().view, view, "it has applied the log");

    nodes.push(fourth);
    nodes.push(fifth);
    for node in &nodes[3..] {
        node.control.propose(node.join()).await.expect("join");
    }
    wait_until("all five see five members", || {
        nodes.iter().all(|node| node.state().members.len() == 5)
    })
    .await;
    // Adding a voter twice is a no-op.
    nodes[0]
        .control
        .add_voter(4, nodes[3].address.clone())
        .await
        .expect("again");
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_compact_the_log_and_bring_a_new_voter_up_to_date() {
    let root = tempfile::tempdir().expect("temp dir");
    let (listeners, voters) = crate::harness::listeners(3).await;
    let mut nodes = Vec::new();
    for (id, listener) in (1..).zip(listeners) {
        let mut config =
            ControlConfig::new(id, voters[&id].clone(), root.path().join(format!("s{id}")));
        config.snapshot_entries = 8;
        nodes.push(Node::start_with(config, listener, &voters).await);
    }
    join_all(&nodes).await;
    for round in 0..20 {
        let name = format!("stream-{round}");
        nodes[round % 3]
            .control
            .propose(Command::CreateStream {
                name: name.clone(),
                config: stream_config(),
            })
            .await
            .expect("create");
        if round % 2 == 0 {
            nodes[0]
                .control
                .propose(Command::DeleteStream { name })
                .await
                .expect("delete");
        }
    }
    let expected = nodes[0].state();
    let log_bytes = std::fs::metadata(nodes[0].dir.join("raft.log"))
        .expect("log")
        .len();
    assert!(
        nodes[0].dir.join("snapshot.json").exists(),
        "a snapshot was taken"
    );

    let listener = bind().await;
    let mut config = ControlConfig::new(
        4,
        listener.local_addr().expect("address").to_string(),
        root.path().join("s4"),
    );
    config.snapshot_entries = 8;
    let fourth = Node::start_with(config, listener, &voters).await;
    nodes[1]
        .control
        .add_voter(4, fourth.address.clone())
        .await
        .expect("add");
    wait_until("the new voter catches up", || {
        let state = fourth.state();
        state.view == expected.view && state.streams == expected.streams
    })
    .await;
    assert!(
        fourth.dir.join("snapshot.json").exists(),
        "it installed a snapshot"
    );
    eprintln!("log of server 1 after 40 entries: {log_bytes} bytes");
    nodes.push(fourth);
    for node in nodes {
        node.stop().await;
    }
}
