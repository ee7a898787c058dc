//! One module per subcommand.

mod bench;
mod console;
mod demo;
mod inbox;
mod maintain;
mod migrate;
mod redrive;
mod relay;
mod status;
mod verify;

use std::process::ExitCode;

use crate::cli::{Cli, Command};
use crate::config;

/// The store `status`, `failed` and `redrive` work on: the outbox, or with `inbox` the
/// inbox's processing queue; and where it lives, for messages.
async fn open_store(
    db: &config::DbSettings,
    inbox: bool,
) -> anyhow::Result<(std::sync::Arc<dyn outbox_core::Store>, String)> {
    if inbox {
        let d = outbox_inbox::InboxDatabase::open(&db.url, &db.schema, 2).await?;
        Ok((d.queue(), d.place()))
    } else {
        let d = outbox_db::open(&db.url, &db.schema, 2).await?;
        d.check().await?;
        Ok((d.store(), d.place()))
    }
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let loaded = config::load(cli.config.as_deref())?;
    match cli.command {
        Command::Migrate(args) => {
            let notify = match (args.notify, args.no_notify) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            };
            let db = config::db(&loaded, &args.db)?;
            if args.inbox {
                migrate::inbox(db).await
            } else {
                let cdc = args.cdc.then_some(args.cdc_group.as_str());
                let code = migrate::run(db.clone(), notify, cdc, args.binlog, &args.grant).await?;
                migrate::debezium(
                    &db,
                    args.adopt_debezium.as_deref(),
                    args.release_debezium.as_deref(),
                )
                .await?;
                Ok(code)
            }
        }
        Command::Maintain(args) => {
            let retention = config::retention(&loaded, args.retention)?;
            maintain::maintain(config::db(&loaded, &args.db)?, retention).await
        }
        Command::Purge(args) => {
            maintain::purge(config::db(&loaded, &args.db)?, args.older_than.0).await
        }
        Command::Relay(args) => relay::run(config::relay(&loaded, &args)?, &args).await,
        Command::Status(args) => {
            let routes = config::routes(&loaded, &args.route)?;
            status::run(config::db(&loaded, &args.db)?, &args, &routes).await
        }
        Command::Bench(args) => bench::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Verify(args) => verify::run(args).await,
        Command::Failed(args) => {
            redrive::failed(
                config::db(&loaded, &args.db)?,
                args.inbox,
                args.limit,
                args.format,
            )
            .await
        }
        Command::Redrive(args) => {
            let scope = if args.all {
                outbox_core::RedriveScope::All
            } else {
                outbox_core::RedriveScope::Ids(args.id)
            };
            redrive::redrive(
                config::db(&loaded, &args.db)?,
                args.inbox,
                scope,
                args.reason,
            )
            .await
        }
        Command::Inbox(args) => inbox::run(config::inbox(&loaded, &args)?, &args).await,
        Command::Console(args) => {
            let routes = config::routes(&loaded, &args.route)?;
            console::run(config::db(&loaded, &args.db)?, routes, args.console).await
        }
        Command::VerifyInboxHandler(args) => verify::inbox_handler(args).await,
    }
}
