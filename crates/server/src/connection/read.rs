//! A connection's reads: `Fetch` of a range, and subscriptions with their
//! credit (`Subscribe`, `Credit`, `Unsubscribe`).

use super::*;

impl Connection {
    /// A read request: `Fetch`, `Subscribe`, `Credit`, `Unsubscribe`.
    pub(super) async fn handle_read(&mut self, frame: Frame) -> bool {
        match frame {
            Frame::Fetch {
                request,
                stream,
                from,
                max_records,
                max_bytes,
            } => {
                self.fetch(request, stream, from, max_records, max_bytes)
                    .await
            }
            Frame::Subscribe {
                subscription,
                stream,
                from,
                credit,
            } => self.subscribe(subscription, stream, from, credit).await,
            Frame::Credit {
                subscription,
                credit,
            } => {
                self.credit(subscription, credit);
                true
            }
            Frame::Unsubscribe { subscription } => self.unsubscribe(subscription).await,
            other => self.not_a_request(&other).await,
        }
    }

    pub(super) async fn fetch(
        &mut self,
        request: u64,
        stream_id: u64,
        from: u64,
        max_records: u32,
        max_bytes: u32,
    ) -> bool {
        let stream = match self.find_allowed(request, stream_id, Right::Consume).await {
            Ok(stream) => stream,
            Err(open) => return open,
        };
        let max_bytes = (max_bytes as usize).min(self.server.config.read_batch_bytes_max);
        let Some(budget) = self.outgoing.reserve_read(max_bytes).await else {
            return false;
        };
        let mut records = Vec::new();
        let visible = stream.visible_version();
        let from = from.max(1);
        let max_records = (max_records as u64).min((visible + 1).saturating_sub(from)) as usize;
        let reply = match stream.log.read(from, max_records, max_bytes, &mut records) {
            Ok(count) => {
                // Void versions hold no message: readers never see them.
                let (records, kept) = subscription::strip_voids(records, count as u32);
                Frame::Records {
                    request,
                    next: from + count as u64,
                    count: kept,
                    records,
                }
            }
            Err(error) => Frame::Error {
                request,
                code: subscription::read_error_code(&error),
                message: error.to_string(),
            },
        };
        self.outgoing.send_read(&reply, budget).await
    }

    pub(super) async fn subscribe(
        &mut self,
        id: u64,
        stream_id: u64,
        from: u64,
        credit: u32,
    ) -> bool {
        let stream = match self.find_allowed(id, stream_id, Right::Consume).await {
            Ok(stream) => stream,
            Err(open) => return open,
        };
        if self.subscriptions.contains_key(&id) {
            // Replacing a live subscription could interleave its queued
            // records with the new one's; ids must be fresh.
            let message = format!("subscription id {id} is in use on this connection");
            return self
                .outgoing
                .error(id, ErrorCode::InvalidArgument, message)
                .await;
        }
        let limit = self.server.config.subscriptions_per_connection_max;
        if self.subscriptions.len() >= limit {
            let message = format!("a connection may hold at most {limit} subscriptions");
            return self.outgoing.error(id, ErrorCode::Busy, message).await;
        }
        let credits = Arc::new(Semaphore::new(
            credit.min(self.server.config.subscription_credit_max) as usize,
        ));
        let task = tokio::spawn(subscription::run(
            id,
            stream,
            from.max(1),
            Arc::clone(&credits),
            Arc::clone(&self.outgoing),
            self.server.config.read_batch_bytes_max,
        ));
        self.subscriptions.insert(id, (task, credits));
        true
    }

    /// More credit for a subscription, up to the configured bound.
    pub(super) fn credit(&mut self, subscription: u64, credit: u32) {
        if let Some((_, credits)) = self.subscriptions.get(&subscription) {
            let limit = self.server.config.subscription_credit_max as usize;
            let room = limit.saturating_sub(credits.available_permits());
            credits.add_permits((credit as usize).min(room));
        }
    }

    pub(super) async fn unsubscribe(&mut self, subscription: u64) -> bool {
        if let Some((task, _)) = self.subscriptions.remove(&subscription) {
            task.abort();
        }
        self.outgoing
            .send(&Frame::Ok {
                request: subscription,
            })
            .await
    }
}
