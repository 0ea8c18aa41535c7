// Every mistake of one item is reported at once, and the function is still emitted: `main`
// calls it without a "cannot find function" error.
#[carmy::tool(effect = "sometimes", timeout = "soon", colour = "red")]
fn now(time: &str) -> u64 {
    time.len() as u64
}

fn main() {
    let _ = now("12:00");
}
