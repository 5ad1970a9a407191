//! A JSON API: typed bodies in and out, state shared by all workers (`Arc`) next to state private
//! to each worker (`Rc`), and the extractor errors (400/413/415/422) as JSON.
//!
//! ```sh
//! cargo run --release -p canter --example json_api
//! curl -i -H 'content-type: application/json' -d '{"title":"write docs"}' http://127.0.0.1:8080/api/todos
//! curl -i http://127.0.0.1:8080/api/todos/1
//! curl -i http://127.0.0.1:8080/api/stats
//! ```

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use canter::rt::http::StatusCode;
use canter::rt::{Config, Server};
use canter::{get, post, Json, Path, Rejection, Router, State};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct NewTodo {
    title: String,
}

#[derive(Clone, Serialize)]
struct Todo {
    id: u64,
    title: String,
    done: bool,
}

/// Shared by every worker.
#[derive(Default)]
struct Todos {
    items: Mutex<BTreeMap<u64, Todo>>,
}

/// Private to one worker: no locking.
#[derive(Default)]
struct WorkerStats {
    worker: usize,
    requests: Cell<u64>,
}

#[derive(Serialize)]
struct Stats {
    worker: usize,
    requests_on_this_worker: u64,
    todos: usize,
}

fn create(
    State(todos): State<Arc<Todos>>,
    State(stats): State<Rc<WorkerStats>>,
    Json(new): Json<NewTodo>,
) -> Result<(StatusCode, Json<Todo>), Rejection> {
    stats.requests.set(stats.requests.get() + 1);
    let mut items = todos
        .items
        .lock()
        .map_err(|_| Rejection::new(StatusCode::INTERNAL_SERVER_ERROR, "lock poisoned"))?;
    let id = items.keys().next_back().map_or(1, |last| last + 1);
    let todo = Todo {
        id,
        title: new.title,
        done: false,
    };
    items.insert(id, todo.clone());
    Ok((StatusCode::CREATED, Json(todo)))
}

fn fetch(
    State(todos): State<Arc<Todos>>,
    State(stats): State<Rc<WorkerStats>>,
    Path(id): Path<u64>,
) -> Result<Json<Todo>, Rejection> {
    stats.requests.set(stats.requests.get() + 1);
    let items = todos
        .items
        .lock()
        .map_err(|_| Rejection::new(StatusCode::INTERNAL_SERVER_ERROR, "lock poisoned"))?;
    items
        .get(&id)
        .cloned()
        .map(Json)
        .ok_or_else(|| Rejection::new(StatusCode::NOT_FOUND, format!("no todo {id}")))
}

/// An `async fn` handler works the same way; it runs as a future on the connection's task.
async fn stats(
    State(todos): State<Arc<Todos>>,
    State(stats): State<Rc<WorkerStats>>,
) -> Json<Stats> {
    let count = todos.items.lock().map(|items| items.len()).unwrap_or(0);
    Json(Stats {
        worker: stats.worker,
        requests_on_this_worker: stats.requests.get(),
        todos: count,
    })
}

fn app(todos: Arc<Todos>, worker: usize) -> Router {
    let api = Router::new()
        .route("/todos", post(create))
        .route("/todos/{id}", get(fetch))
        .route("/stats", get(stats));
    Router::new()
        .nest("/api", api)
        .body_limit(64 * 1024)
        .with_state(todos)
        .with_state(Rc::new(WorkerStats {
            worker,
            ..Default::default()
        }))
}

fn main() -> std::io::Result<()> {
    let server = Server::bind(Config::default())?;
    canter::rt::shutdown_on_signals(server.shutdown_handle())?;
    println!("listening on http://{}/api/todos", server.local_addr());
    let todos = Arc::new(Todos::default());
    server.serve(move |worker| app(todos.clone(), worker))
}
