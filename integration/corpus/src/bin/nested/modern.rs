// corpus: min-rustc 1.85
//! Features newer than Debian's rustc 1.63: `async fn` in a trait (1.75) and
//! async closures (1.85). Left out with `--cfg old_rustc`.

use super::{c, YieldOnce};

trait Animal {
    async fn speak(&self) -> u64;
}

struct Dog {
    loudness: u64,
}

impl Animal for Dog {
    async fn speak(&self) -> u64 {
        YieldOnce::new().await; // await: speak -> yield
        self.loudness * 3
    }
}

pub async fn modern_part() -> u64 {
    let dog = Dog { loudness: 5 };
    let spoken = dog.speak().await; // await: modern_part -> speak
    let offset = 10;
    let add = async |x: u64| -> u64 {
        let r = c(x).await; // await: modern_part::{async_closure} -> c
        r + offset
    };
    let closed = add(2).await; // await: modern_part -> async_closure
    println!("locals: spoken={spoken} closed={closed}");
    spoken + closed
}
