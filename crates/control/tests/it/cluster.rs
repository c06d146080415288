//! A three-voter cluster: agreement, forwarding, failover and the failure
//! detector.

use std::time::Instant;

use control::{Command, ControlError, Response};

use crate::harness::{cluster, join_all, leader, stream_config, wait_until, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_agree_and_a_follower_sees_its_own_proposal() {
    let root = tempfile::tempdir().expect("temp dir");
    let nodes = cluster(3, &root).await;
    join_all(&nodes).await;
    for node in &nodes {
        let state = node.state();
        assert_eq!(state.view, 3, "server {}", node.id);
        assert_eq!(state.members.len(), 3, "server {}", node.id);
    }

    let leader = leader(&nodes).await;
    let follower = nodes
        .iter()
        .find(|node| node.id != leader)
        .expect("a follower");
    let response = follower
        .control
        .propose(Command::CreateStream {
            name: "orders".to_string(),
            config: stream_config(),
        })
        .await
        .expect("create on a follower");
    assert!(matches!(response, Response::Stream(_)), "{response:?}");
    assert!(
        follower.state().streams.contains_key("orders"),
        "the follower's state shows its proposal when propose returns"
    );
    wait_until("every node has the stream", || {
        nodes
            .iter()
            .all(|node| node.state().streams.contains_key("orders"))
    })
    .await;
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_takes_over_and_the_stopped_one_is_removed() {
    let root = tempfile::tempdir().expect("temp dir");
    let mut nodes = cluster(3, &root).await;
    join_all(&nodes).await;
    let old_leader = leader(&nodes).await;
    let position = nodes
        .iter()
        .position(|node| node.id == old_leader)
        .expect("leader");
    let stopped_at = Instant::now();
    nodes.remove(position).stop().await;

    wait_until("the survivors elect a new leader", || {
        nodes.iter().all(|node| {
            node.control
                .leader()
                .is_some_and(|leader| leader != old_leader)
        })
    })
    .await;
    let response = within(
        "a proposal after failover",
        nodes[0].control.propose(Command::CreateStream {
            name: "after-failover".to_string(),
            config: stream_config(),
        }),
    )
    .await
    .expect("commits after failover");
    assert!(matches!(response, Response::Stream(_)), "{response:?}");

    wait_until("the failure detector removes the stopped leader", || {
        nodes
            .iter()
            .all(|node| !node.state().members.contains_key(&old_leader))
    })
    .await;
    let removed_after = stopped_at.elapsed();
    let state = nodes[0].state();
    assert_eq!(state.members.len(), 2);
    assert!(
        state
            .transitions
            .iter()
            .any(|transition| transition.what.contains("no heartbeat for")),
        "{:?}",
        state.transitions
    );
    eprintln!("the stopped leader was removed after {removed_after:?}");
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_keep_beating_are_not_removed() {
    let root = tempfile::tempdir().expect("temp dir");
    let nodes = cluster(3, &root).await;
    join_all(&nodes).await;
    let view = nodes[0].state().view;
    // Three suspect timeouts of quiet operation.
    tokio::time::sleep(std::time::Duration::from_millis(3000)).await;
    for node in &nodes {
        let state = node.state();
        assert_eq!(
            state.view, view,
            "server {}: {:?}",
            node.id, state.transitions
        );
        assert_eq!(state.members.len(), 3);
    }
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_refuses_proposals() {
    let root = tempfile::tempdir().expect("temp dir");
    let nodes = cluster(1, &root).await;
    join_all(&nodes).await;
    let control = nodes[0].control.clone();
    nodes.into_iter().next().expect("node").stop().await;
    let error = control
        .propose(Command::DeleteStream {
            name: "none".to_string(),
        })
        .await
        .expect_err("stopped");
    assert!(matches!(error, ControlError::Stopped { id: 1 }), "{error}");
}
