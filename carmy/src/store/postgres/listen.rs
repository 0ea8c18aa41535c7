//! Changes of executions announced with `NOTIFY` and heard on one connection of its own
//! (`LISTEN`), so other replicas stream and cancel them as they happen.

use futures_util::StreamExt;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, Socket};

use super::failed;
use crate::store::StoreError;
use crate::store::announcements::AnnouncedIds;

/// The channel on which changes of executions are announced (`NOTIFY`, payload the id).
pub(super) const ANNOUNCEMENTS: &str = "carmy_executions";

/// Opens a connection, sends `LISTEN`, and yields the announced execution ids until the
/// connection ends.
pub(super) async fn listen<T>(
    config: &tokio_postgres::Config,
    tls: T,
) -> Result<AnnouncedIds, StoreError>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = config.connect(tls).await.map_err(failed)?;
    // The connection does its work when polled for messages: poll it while LISTEN runs.
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    let subscribe = format!("LISTEN {ANNOUNCEMENTS}");
    {
        let mut subscribed = std::pin::pin!(client.batch_execute(&subscribe));
        loop {
            tokio::select! {
                done = &mut subscribed => {
                    done.map_err(failed)?;
                    break;
                }
                message = messages.next() => match message {
                    Some(Ok(_)) => {}
                    Some(Err(error)) => return Err(failed(error)),
                    None => return Err(StoreError::message("the listening connection closed")),
                },
            }
        }
    }
    let ids = messages
        // Ends with the connection (an error, or its end); the client lives as long.
        .scan(client, |_, message| std::future::ready(message.ok()))
        .filter_map(|message| {
            std::future::ready(match message {
                AsyncMessage::Notification(notification) => Some(notification.payload().to_owned()),
                _ => None,
            })
        });
    Ok(ids.boxed())
}
