//! Writing the page: one HTML file with its style, its script and the model, nothing fetched from anywhere.
//!
//! The model goes into a `<script type="application/json">` element. JSON text never holds `<`, `>` or `&`
//! outside strings, so writing those three as `\u003c`, `\u003e`, `\u0026` everywhere keeps a frame's
//! `</script>` or `<!--` from ending or changing the element, and U+2028/U+2029 are written escaped too (the
//! script reads the element's text with `JSON.parse`, which takes either form).

use std::io::{self, BufRead, Write};

use serde::Serialize;

use super::Summary;
use super::frames::{CHUNK, Store};
use super::model::{Builder, Model};
use super::read::{Line, Reader, Record};

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// `text` made safe inside an HTML element or a quoted attribute.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON text made safe inside a `<script>` element (see the module's docs).
pub fn escape_script_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + json.len() / 64);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// A JSON formatter that writes `<`, `>`, `&`, U+2028 and U+2029 inside strings as `\u` escapes (see the
/// module's docs), so the model streams into its element without a copy.
struct ScriptSafe;

impl serde_json::ser::Formatter for ScriptSafe {
    fn write_string_fragment<W: ?Sized + Write>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let esc = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(esc.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

/// Counts what goes through.
struct Counted<'a, W> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The page's head and the markup the script fills in.
fn head(title: &str) -> String {
    let title = escape_html(title);
    let mut out = String::with_capacity(STYLE.len() + 4096);
    out.push_str("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    // Nothing may be fetched: no network, no other file.
    out.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; \
         script-src 'unsafe-inline'; img-src data:\">\n",
    );
    out.push_str(&format!("<title>{title} · acp-replay view</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n"));
    out.push_str(&format!(
        "<header><h1>{title}</h1><span id=\"stats\"></span>\
         <input id=\"search\" type=\"search\" placeholder=\"search method, session, text\" autocomplete=\"off\">\
         <span id=\"hits\"></span>\
         <span class=\"zoom\"><button id=\"zoom-out\" title=\"zoom out (ctrl + wheel)\">−</button>\
         <button id=\"zoom-fit\" title=\"fit the whole trace\">fit</button>\
         <button id=\"zoom-in\" title=\"zoom in (ctrl + wheel)\">+</button></span></header>\n\
         <details id=\"bad\" hidden><summary></summary><ol></ol></details>\n\
         <div id=\"legend\"></div>\n\
         <main id=\"view\"><canvas id=\"canvas\"></canvas><div id=\"scroll\"><div id=\"space\"></div></div></main>\n\
         <aside id=\"detail\" hidden><button id=\"close\" title=\"close\">×</button><div id=\"detail-body\"></div></aside>\n\
         <noscript>This page draws the trace with its script; allow scripts for this file.</noscript>\n"
    ));
    out
}

/// Writes the whole page: the head, each chunk of frames as the trace is read, then the model and the script.
pub fn write(input: impl BufRead, out: &mut impl Write, title: &str) -> io::Result<Summary> {
    let mut out = Counted { inner: out, n: 0 };
    out.write_all(head(title).as_bytes())?;
    let mut reader = Reader::new(input);
    let mut builder = Builder::new();
    let mut store = Store::new();
    while let Some(line) = reader.next_line_item() {
        if let Line::Record(rec) = &line {
            store.push(rec, &mut out)?;
        }
        builder.push(line);
    }
    store.finish(&mut out)?;
    let model = builder.finish(reader.clock);
    tail(&mut out, &model)?;
    Ok(Summary {
        frames: model.frames,
        lanes: model.lanes.len(),
        items: model.items.len(),
        bad_lines: model.bad.len(),
        bytes: out.n,
    })
}

/// Writes the page of a model built elsewhere, whose frames are `records` (in the model's numbering).
pub fn write_model<'a>(
    out: &mut impl Write,
    model: &Model,
    records: impl Iterator<Item = &'a Record>,
    title: &str,
) -> io::Result<()> {
    out.write_all(head(title).as_bytes())?;
    let mut store = Store::new();
    for rec in records {
        store.push(rec, out)?;
    }
    store.finish(out)?;
    tail(out, model)
}

/// The model and the script, after the frames.
fn tail(out: &mut impl Write, model: &Model) -> io::Result<()> {
    out.write_all(b"<script type=\"application/json\" id=\"model\">")?;
    let page = PageModel { chunk: CHUNK, model };
    let mut ser = serde_json::Serializer::with_formatter(&mut *out, ScriptSafe);
    page.serialize(&mut ser).map_err(io::Error::other)?;
    out.write_all(b"</script>\n<script>\n")?;
    out.write_all(SCRIPT.as_bytes())?;
    out.write_all(b"</script>\n</body>\n</html>\n")?;
    out.flush()
}

/// What the page's script reads: the model and how the frames are chunked.
#[derive(Serialize)]
struct PageModel<'a> {
    chunk: usize,
    #[serde(flatten)]
    model: &'a Model,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_json_cannot_end_its_element() {
        let hostile =
            serde_json::to_string(&"</script><script>alert(1)</script><!-- \u{2028}\u{2029} & 中文 🙂").unwrap();
        let safe = escape_script_json(&hostile);
        assert!(!safe.contains('<') && !safe.contains('>') && !safe.contains('&'), "{safe}");
        assert!(!safe.contains('\u{2028}') && !safe.contains('\u{2029}'));
        let back: String = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, "</script><script>alert(1)</script><!-- \u{2028}\u{2029} & 中文 🙂");
    }

    #[test]
    fn titles_are_escaped() {
        assert_eq!(escape_html("<b a=\"x\">&'"), "&lt;b a=&quot;x&quot;&gt;&amp;&#39;");
    }
}
