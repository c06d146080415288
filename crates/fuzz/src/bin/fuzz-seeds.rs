//! Writes every target's seeds into its corpus folder (`fuzz/corpus/<target>/seed-<n>`),
//! the inputs the fuzzers start from: `cargo run -p fuzz --bin fuzz-seeds -- fuzz/corpus`.

fn main() -> std::io::Result<()> {
    let root = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fuzz/corpus".into());
    for target in fuzz::TARGETS {
        let folder = std::path::Path::new(&root).join(target.name);
        std::fs::create_dir_all(&folder)?;
        let seeds = (target.seeds)();
        for (index, seed) in seeds.iter().enumerate() {
            std::fs::write(folder.join(format!("seed-{index}")), seed)?;
        }
    }
    Ok(())
}
