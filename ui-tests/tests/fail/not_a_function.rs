#[carmy::tool(effect = "read")]
struct Clock;

fn main() {}
