//! Tests of the byte formats against their documents: every hex example of
//! `docs/wire-format.md` decodes to a frame that encodes back to the same
//! bytes, so the document cannot drift from the code.

use proto::Frame;

/// Every hex dump in `text` (lines `0000: 1b 00 …   comment`), in order.
fn hex_examples(text: &str) -> Vec<Vec<u8>> {
    let mut examples = Vec::new();
    let mut current: Option<Vec<u8>> = None;
    for line in text.lines() {
        let dump = line.split_once(": ").filter(|(offset, _)| {
            offset.len() == 4 && offset.chars().all(|c| c.is_ascii_hexdigit())
        });
        match dump {
            Some((offset, rest)) => {
                let bytes = current.get_or_insert_with(Vec::new);
                let at = usize::from_str_radix(offset, 16).expect("a hex offset");
                assert_eq!(
                    at,
                    bytes.len(),
                    "a dump line starts where the last ended: {line}"
                );
                let hex = rest.split("   ").next().unwrap_or("");
                for pair in hex.split_whitespace() {
                    bytes.push(u8::from_str_radix(pair, 16).expect("a hex byte"));
                }
            }
            None => {
                if let Some(bytes) = current.take() {
                    examples.push(bytes);
                }
            }
        }
    }
    examples.extend(current);
    examples
}

#[test]
fn every_hex_example_of_the_wire_format_is_a_frame_the_code_makes() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/wire-format.md");
    let text = std::fs::read_to_string(path).expect("docs/wire-format.md");
    let examples = hex_examples(&text);
    assert!(examples.len() >= 5, "the document has its worked examples");
    for bytes in examples {
        let (frame, used) = Frame::decode(&bytes, 1 << 20)
            .unwrap_or_else(|error| panic!("{bytes:02x?} does not decode: {error}"))
            .unwrap_or_else(|| panic!("{bytes:02x?} is not a whole frame"));
        assert_eq!(used, bytes.len(), "one frame per example: {frame:?}");
        assert_eq!(frame.to_bytes(), bytes, "{frame:?} encodes to other bytes");
    }
}

#[test]
fn the_hello_example_is_the_documented_hello() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/wire-format.md");
    let text = std::fs::read_to_string(path).expect("docs/wire-format.md");
    let hello = Frame::Hello {
        version: 1,
        client: 0x0001_0203_0405_0607_0809_0a0b_0c0d_0e0f,
        token: "tok".to_string(),
    };
    assert_eq!(hex_examples(&text)[0], hello.to_bytes());
}
