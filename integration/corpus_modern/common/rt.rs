//! Shared by the modern corpus' programs (`#[path] mod rt;`): the runtime
//! flavour from argv[1] (`ct`: one thread, the default; `mt`: two workers) and
//! the line a program prints when it reaches its marker.
#![allow(dead_code)]

/// True for `mt`, false for `ct` (or no argument); exits with a usage line otherwise.
pub fn multi_thread(program: &str) -> bool {
    match std::env::args().nth(1).as_deref() {
        None | Some("ct") => false,
        Some("mt") => true,
        Some(other) => {
            eprintln!("usage: {program} [ct|mt]  (got {other:?})");
            std::process::exit(2)
        }
    }
}

/// A tokio runtime of the flavour argv[1] asks for, with time and I/O.
pub fn tokio_runtime(program: &str) -> tokio::runtime::Runtime {
    let mut builder = if multi_thread(program) {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().expect("tokio runtime")
}

/// Prints `<program> ready pid=<pid>` (flushed): the program is at its marker.
pub fn ready(program: &str) {
    use std::io::Write;
    println!("{program} ready pid={}", std::process::id());
    std::io::stdout().flush().expect("flush stdout");
}

/// tokio's own task dump (`Handle::dump()`: every spawned task's trace), between `==dump==`
/// and `==end==`, into the file `$TK_DUMP_FILE` names (printed when unset). Only in builds
/// with `--cfg tokio_unstable --cfg tokio_taskdump`; a no-op in the others.
#[cfg(tokio_taskdump)]
pub async fn task_dump() {
    let dump = tokio::runtime::Handle::current().dump().await;
    let mut text = String::from("==dump==\n");
    for task in dump.tasks().iter() {
        text += &format!("TASK\n{}\n", task.trace());
    }
    text += "==end==\n";
    match std::env::var_os("TK_DUMP_FILE") {
        Some(path) => std::fs::write(path, text).expect("write the dump"),
        None => print!("{text}"),
    }
}

#[cfg(not(tokio_taskdump))]
pub async fn task_dump() {}
