//! One self-contained HTML page of a replay (or a simulation), in the
//! spirit of PyTorch's `memory_viz`: memory over time with zoom, the
//! allocations live at the peak and at any sampled moment with the stacks
//! that made them, and a summary table per stream and pool with the
//! driver's figures. No network, no CDN: the data sits inline as JSON and
//! a small script draws it (`docs/trace.md`, "The HTML report").

use crate::memory::Bytes;
use crate::replay::{LiveSamples, ReplayReport, StreamReplay};
use crate::timeline::Timeline;
use crate::trace::Frame;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::Path;

/// A table of the page: a title, its columns, and rows of text cells.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// What it shows.
    pub title: String,
    /// Column headings.
    pub columns: Vec<String>,
    /// One row of cells each.
    pub rows: Vec<Vec<String>>,
}

/// What a page shows.
#[derive(Debug, Clone)]
pub struct Page<'a> {
    /// The page's title.
    pub title: String,
    /// The headline figures: (id, label, value); each value is shown in an
    /// element of that id (`fact-<id>`), as the text report writes it.
    pub facts: Vec<Fact>,
    /// Memory over time.
    pub timeline: &'a Timeline,
    /// The allocations live at sampled moments, where there is a trace.
    pub samples: Option<&'a LiveSamples>,
    /// The stacks the samples' allocations name.
    pub stacks: &'a [Vec<Frame>],
    /// Summary tables.
    pub tables: Vec<Table>,
    /// Lines said under the headline.
    pub notes: Vec<String>,
}

/// Escape text for HTML.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page's data, as its script reads it.
fn data(page: &Page<'_>) -> Value {
    let timeline = page.timeline;
    let buckets: Vec<Value> = timeline
        .buckets
        .iter()
        .map(|b| {
            json!([
                b.start,
                b.end,
                b.live.min,
                b.live.max,
                b.reserved.min,
                b.reserved.max,
                b.recorded.map(|r| r.max),
                b.stream_reserved,
                b.failures,
            ])
        })
        .collect();
    let (samples, allocations) = match page.samples {
        Some(samples) => (
            samples
                .samples
                .iter()
                .map(|s| {
                    json!({
                        "e": s.event, "t": s.time_ns, "live": s.live_bytes,
                        "n": s.live_allocations, "top": s.largest, "peak": s.at_peak,
                    })
                })
                .collect::<Vec<_>>(),
            samples
                .allocations
                .iter()
                .map(|a| json!([a.size, a.device, a.stream, a.event, a.time_ns, a.stack]))
                .collect::<Vec<_>>(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let stacks: Vec<Value> = page
        .stacks
        .iter()
        .map(|stack| {
            stack
                .iter()
                .map(|f| json!([f.name, f.filename, f.line]))
                .collect::<Vec<_>>()
                .into()
        })
        .collect();
    json!({
        "x_label": timeline.x_label,
        "timed": timeline.x_label != "event",
        "buckets": buckets,
        "streams": timeline.streams,
        "budget": timeline.budget,
        "recorded_name": timeline.recorded_name,
        "samples": samples,
        "allocs": allocations,
        "stacks": stacks,
    })
}

/// The page as HTML.
pub fn render(page: &Page<'_>) -> String {
    let mut html = String::with_capacity(64 * 1024);
    let title = esc(&page.title);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title><style>{STYLE}</style></head><body>\n<h1>{title}</h1>\n<dl class=\"facts\">"
    );
    for (id, label, value) in &page.facts {
        let _ = write!(
            html,
            "<div><dt>{}</dt><dd id=\"fact-{}\">{}</dd></div>",
            esc(label),
            esc(id),
            esc(value)
        );
    }
    html.push_str("</dl>\n");
    for note in &page.notes {
        let _ = writeln!(html, "<p class=\"note\">{}</p>", esc(note));
    }
    html.push_str(CHART);
    if page.samples.is_some() {
        html.push_str(ALLOCATIONS);
    }
    for table in &page.tables {
        let _ = write!(
            html,
            "<h2>{}</h2><div class=\"scroll\"><table class=\"summary\"><thead><tr>",
            esc(&table.title)
        );
        for column in &table.columns {
            let _ = write!(html, "<th>{}</th>", esc(column));
        }
        html.push_str("</tr></thead><tbody>");
        for row in &table.rows {
            html.push_str("<tr>");
            for cell in row {
                let _ = write!(html, "<td>{}</td>", esc(cell));
            }
            html.push_str("</tr>");
        }
        html.push_str("</tbody></table></div>\n");
    }
    // Inline JSON: `</` would end the script element.
    let json = data(page).to_string().replace("</", "<\\/");
    let _ = write!(
        html,
        "<script type=\"application/json\" id=\"data\">{json}</script>\n<script>{SCRIPT}</script>\n</body></html>\n"
    );
    html
}

/// Write the page to `path`.
pub fn write_html(page: &Page<'_>, path: &Path) -> Result<(), String> {
    std::fs::write(path, render(page)).map_err(|e| format!("{}: {e}", path.display()))
}

/// A headline figure: (id, label, value).
pub type Fact = (String, String, String);

fn fact(id: &str, label: &str, value: impl ToString) -> Fact {
    (id.to_string(), label.to_string(), value.to_string())
}

/// The peaks, as every report opens its figures.
fn peak_facts(live: u64, reserved: u64, reserved_label: &str, ratio: f64) -> [Fact; 3] {
    [
        fact("peak-live", "peak live", Bytes(live)),
        fact("peak-reserved", reserved_label, Bytes(reserved)),
        fact(
            "reserved-over-live",
            "reserved / live",
            format!("{ratio:.3}"),
        ),
    ]
}

/// What the device held once the load fell, the failures, and the driver.
fn closing_facts(
    settled: u64,
    failures: (&str, u64),
    driver: &crate::storage::DriverReport,
    per: &str,
) -> [Fact; 4] {
    [
        fact(
            "settled-reserved",
            "reserved after the load fell",
            Bytes(settled),
        ),
        fact("failures", failures.0, failures.1),
        fact(
            "driver",
            &format!("driver, modeled (us per {per})"),
            format!("{:.1}", driver.modeled_us_per_event),
        ),
        fact(
            "mapped-over-peak",
            "granules mapped / peak",
            format!("{:.2}", driver.mapped_over_peak),
        ),
    ]
}

/// The headline figures of a replay, worded as the text report words them.
pub fn replay_facts(report: &ReplayReport, recorded: &str) -> Vec<Fact> {
    let mut facts = vec![fact("events", "events", report.events)];
    facts.extend(peak_facts(
        report.peak_live_bytes,
        report.peak_reserved_bytes,
        "peak reserved (streamalloc)",
        report.reserved_over_live,
    ));
    if let Some(theirs) = report.recorded_peak_reserved_bytes {
        facts.push(fact(
            "recorded-reserved",
            &format!("{recorded} reserved"),
            Bytes(theirs),
        ));
    }
    facts.extend(closing_facts(
        report.settled_reserved_bytes,
        ("failures", report.failures),
        &report.driver,
        "event",
    ));
    facts.push(fact(
        "driver-in-trace",
        "of it up to the trace's last event",
        format!("{:.1}", report.driver_in_trace.modeled_us_per_event),
    ));
    facts
}

/// The summary tables of a replay: per stream (as `memory_summary()` per
/// pool and stream) and per pool.
pub fn replay_tables(report: &ReplayReport) -> Vec<Table> {
    let devices: Vec<&ReplayReport> = if report.devices.is_empty() {
        vec![report]
    } else {
        report.devices.iter().collect()
    };
    let mut streams = Table {
        title: "Per stream".into(),
        columns: [
            "device",
            "stream",
            "trace stream",
            "events",
            "allocations",
            "allocated",
            "frees",
            "freed",
            "failures",
            "live at the end",
            "reserved after the fall",
            "peak live",
            "peak reserved",
            "granules mapped / peak",
            "driver us / event",
            "stream waits",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let mut pools = pool_table("Per pool, once the load fell", true);
    let paths = path_table(&devices);
    for device in devices {
        let id = device.device.unwrap_or(0).to_string();
        for stream in &device.per_stream {
            streams.rows.push(stream_row(&id, stream));
            for pool in &stream.pools {
                let mut row = vec![id.clone()];
                row.extend(pool_row(stream.stream, pool));
                pools.rows.push(row);
            }
        }
    }
    vec![streams, pools, paths]
}

/// The driver's modeled time by the path that asked, device by device,
/// how much of it came up to the trace's last event, and the granules
/// each path mapped.
fn path_table(devices: &[&ReplayReport]) -> Table {
    let mut table = Table {
        title: "Driver time by path".into(),
        columns: [
            "device",
            "path",
            "calls",
            "modeled ms",
            "us / event",
            "up to the last event, us / event",
            "granules mapped",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    for device in devices {
        let id = device.device.unwrap_or(0).to_string();
        for cost in &device.driver.by_path {
            let in_trace = (device.driver_in_trace.by_path.iter())
                .find(|before| before.path == cost.path)
                .map_or(0.0, |before| before.us_per_event);
            table.rows.push(vec![
                id.clone(),
                cost.path.to_string(),
                cost.calls.to_string(),
                format!("{:.2}", cost.modeled_ns as f64 / 1e6),
                format!("{:.2}", cost.us_per_event),
                format!("{in_trace:.2}"),
                cost.granules_mapped.to_string(),
            ]);
        }
    }
    table
}

/// The headline figures of a simulation, worded as its text report.
pub fn simulation_facts(report: &crate::simulate::SimulationReport) -> Vec<Fact> {
    let mut facts = vec![fact("requests", "requests", report.requests)];
    facts.extend(peak_facts(
        report.peak_live_bytes,
        report.peak_reserved_bytes,
        "peak reserved",
        report.peak_reserved_bytes as f64 / report.peak_live_bytes.max(1) as f64,
    ));
    facts.extend(closing_facts(
        report.settled_reserved_bytes,
        ("failed requests", report.failed_requests),
        &report.driver,
        "reservation",
    ));
    facts
}

/// The per-stream and per-pool tables of a simulation.
pub fn simulation_tables(report: &crate::simulate::SimulationReport) -> Vec<Table> {
    let mut streams = Table {
        title: "Per stream".into(),
        columns: [
            "stream",
            "reservations",
            "per second",
            "peak live",
            "peak reserved",
            "reserved / live",
            "round trip p50 (us)",
            "p99 (us)",
            "relocated",
            "granules mapped / peak",
            "driver us / reservation",
            "stream waits",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let mut pools = pool_table("Per pool, once the load fell", false);
    for s in &report.streams {
        streams.rows.push(vec![
            s.stream.to_string(),
            s.reservations.to_string(),
            format!("{:.0}", s.reservations_per_second),
            Bytes(s.peak_live_bytes).to_string(),
            Bytes(s.peak_reserved_bytes).to_string(),
            format!("{:.3}", s.reserved_over_live),
            format!("{:.1}", s.round_trip_p50_us),
            format!("{:.1}", s.round_trip_p99_us),
            s.relocated.to_string(),
            format!(
                "{} / {}",
                s.driver.granules_mapped, s.driver.peak_granules_mapped
            ),
            format!("{:.1}", s.driver.modeled_us_per_event),
            s.driver.stream_waits.to_string(),
        ]);
        for pool in &s.pools {
            pools.rows.push(pool_row(s.stream, pool));
        }
    }
    vec![streams, pools]
}

/// An empty table of pools (with a device column first where `devices`).
fn pool_table(title: &str, devices: bool) -> Table {
    let columns = [
        "stream",
        "pool",
        "pages",
        "peak pages",
        "allocations",
        "in use",
        "reserved",
        "peak in use",
        "peak reserved",
        "largest",
    ];
    Table {
        title: title.into(),
        columns: devices
            .then_some("device")
            .into_iter()
            .chain(columns)
            .map(String::from)
            .collect(),
        rows: Vec::new(),
    }
}

/// A pool's cells, from its stream on.
fn pool_row(stream: u32, pool: &crate::simulate::PoolFigures) -> Vec<String> {
    vec![
        stream.to_string(),
        pool.kind.clone(),
        pool.pages.to_string(),
        pool.pages_peak.to_string(),
        pool.allocations.to_string(),
        Bytes(pool.bytes_in_use).to_string(),
        Bytes(pool.bytes_reserved).to_string(),
        Bytes(pool.peak_bytes_in_use).to_string(),
        Bytes(pool.peak_bytes_reserved).to_string(),
        Bytes(pool.largest_alloc).to_string(),
    ]
}

fn stream_row(device: &str, s: &StreamReplay) -> Vec<String> {
    vec![
        device.to_string(),
        s.stream.to_string(),
        s.trace_stream.to_string(),
        s.events.to_string(),
        s.allocations.to_string(),
        Bytes(s.bytes_allocated).to_string(),
        s.frees.to_string(),
        Bytes(s.bytes_freed).to_string(),
        s.failures.to_string(),
        Bytes(s.live_bytes).to_string(),
        Bytes(s.reserved_bytes).to_string(),
        Bytes(s.peak_live_bytes).to_string(),
        Bytes(s.peak_reserved_bytes).to_string(),
        format!(
            "{} / {}",
            s.driver.granules_mapped, s.driver.peak_granules_mapped
        ),
        format!("{:.1}", s.driver.modeled_us_per_event),
        s.driver.stream_waits.to_string(),
    ]
}

const STYLE: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.4em;margin:0 0 .6em} h2{font-size:1.1em;margin:1.4em 0 .4em}
.facts{display:flex;flex-wrap:wrap;gap:.5em 1.8em;margin:0 0 .8em}
.facts div{min-width:9em} dt{color:#666;font-size:.85em} dd{margin:0;font-size:1.15em;font-weight:600}
.note{color:#555;margin:.2em 0}
#chart{width:100%;height:420px;border:1px solid #ddd;user-select:none;cursor:crosshair}
.legend{display:flex;flex-wrap:wrap;gap:.3em 1.2em;margin:.4em 0;font-size:.9em}
.legend span::before{content:"";display:inline-block;width:1.4em;height:.25em;margin-right:.35em;vertical-align:middle;background:var(--c)}
button{font:inherit;padding:.15em .7em}
table{border-collapse:collapse;font-size:.9em} th,td{border-bottom:1px solid #e4e4e4;padding:.25em .6em;text-align:right;white-space:nowrap}
th{background:#f6f6f6;position:sticky;top:0} td.l,th.l{text-align:left;white-space:normal}
.scroll{overflow:auto;max-height:32em} details summary{cursor:pointer} .frames{font-family:ui-monospace,monospace;font-size:.85em;color:#444}
"#;

const CHART: &str = r#"<h2>Memory over time</h2>
<div><button id="reset">Reset zoom</button> <span class="note">Drag across the chart to zoom in, scroll to zoom around the pointer, click to see what was live then.</span></div>
<svg id="chart" viewBox="0 0 1000 420" preserveAspectRatio="none"></svg>
<div class="legend" id="legend"></div>
"#;

const ALLOCATIONS: &str = r#"<h2 id="moment">Live allocations</h2>
<p class="note" id="moment-note"></p>
<div class="scroll"><table id="allocations"><thead><tr><th>#</th><th>size</th><th>device</th><th>stream</th><th>age</th><th class="l">made by</th></tr></thead><tbody></tbody></table></div>
"#;

const SCRIPT: &str = r##"
"use strict";
const D=JSON.parse(document.getElementById("data").textContent);
const svg=document.getElementById("chart");const NS="http://www.w3.org/2000/svg";
const W=1000,H=420,L=70,R=10,T=10,B=30;
const fmtB=v=>{const u=["B","KiB","MiB","GiB","TiB"];let i=0;while(v>=1024&&i<4){v/=1024;i++}return i?v.toFixed(2)+" "+u[i]:v+" B"};
const sx=s=>D.timed?s.t/1e9:s.e;
const fmtX=x=>D.timed?(x<1?(x*1e3).toFixed(1)+" ms":x.toFixed(3)+" s"):Math.round(x).toString();
const lo=D.buckets.length?D.buckets[0][0]:0, hi=D.buckets.length?D.buckets[D.buckets.length-1][1]:1;
let x0=lo,x1=hi>lo?hi:lo+1,chosen=null;
const colors=["#8e44ad","#16a085","#d35400","#2c3e50","#c0392b","#27ae60","#7f8c8d","#f39c12"];
function el(n,a,p){const e=document.createElementNS(NS,n);for(const k in a)e.setAttribute(k,a[k]);(p||svg).appendChild(e);return e}
function px(x){return L+(x-x0)/(x1-x0)*(W-L-R)}
function xOf(p){return x0+(p-L)/(W-L-R)*(x1-x0)}
function draw(){
 svg.innerHTML="";
 const vis=D.buckets.filter(b=>b[1]>=x0&&b[0]<=x1);
 let top=1;for(const b of vis)top=Math.max(top,b[3],b[5],b[6]||0);if(D.budget)top=Math.max(top,D.budget);top*=1.05;
 const py=v=>H-B-(v/top)*(H-T-B);
 for(let i=0;i<=4;i++){const v=top*i/4,y=py(v);el("line",{x1:L,x2:W-R,y1:y,y2:y,stroke:"#eee"});const t=el("text",{x:L-4,y:y+4,"text-anchor":"end","font-size":11,fill:"#666"});t.textContent=fmtB(v)}
 for(let i=0;i<=5;i++){const x=x0+(x1-x0)*i/5,p=px(x);const t=el("text",{x:p,y:H-8,"text-anchor":"middle","font-size":11,fill:"#666"});t.textContent=fmtX(x)}
 const line=(pick,c,w,dash)=>{const pts=[];for(const b of vis){const v=pick(b);if(v==null)continue;pts.push(px(Math.max(b[0],x0)).toFixed(1)+","+py(v).toFixed(1));pts.push(px(Math.min(b[1],x1)).toFixed(1)+","+py(v).toFixed(1))}if(pts.length)el("polyline",{points:pts.join(" "),fill:"none",stroke:c,"stroke-width":w,"stroke-dasharray":dash||""})};
 D.streams.forEach((n,i)=>line(b=>b[7][i]==null?null:b[7][i],colors[i%colors.length],1,"3,2"));
 // Live as an area, what holds it as lines over it.
 const area=[];for(const b of vis){area.push(px(Math.max(b[0],x0)).toFixed(1)+","+py(b[3]).toFixed(1));area.push(px(Math.min(b[1],x1)).toFixed(1)+","+py(b[3]).toFixed(1))}
 if(area.length){const first=area[0].split(",")[0],last=area[area.length-1].split(",")[0];el("polygon",{points:first+","+py(0)+" "+area.join(" ")+" "+last+","+py(0),fill:"rgba(41,128,185,.25)",stroke:"#2980b9","stroke-width":1})}
 line(b=>b[6],"#999",1.5,"6,3");
 line(b=>b[5],"#e67e22",2);
 if(D.budget){const y=py(D.budget);el("line",{x1:L,x2:W-R,y1:y,y2:y,stroke:"#c0392b","stroke-dasharray":"8,4"})}
 for(const b of vis)if(b[8]>0)el("circle",{cx:px((b[0]+b[1])/2),cy:H-B-4,r:3,fill:"#c0392b"});
 const peak=D.samples.find(s=>s.peak);
 if(peak){const p=px(sx(peak));if(p>=L&&p<=W-R)el("line",{x1:p,x2:p,y1:T,y2:H-B,stroke:"#c0392b","stroke-dasharray":"2,3"})}
 if(chosen){const p=px(sx(chosen));if(p>=L&&p<=W-R)el("line",{x1:p,x2:p,y1:T,y2:H-B,stroke:"#000"})}
 el("text",{x:W-R,y:H-B-6,"text-anchor":"end","font-size":11,fill:"#666"}).textContent=D.x_label;
}
function legend(){
 const items=[["live (the trace), shaded","#2980b9"],["reserved (streamalloc)","#e67e22"]];
 if(D.recorded_name)items.push([D.recorded_name+" reserved","#999"]);
 D.streams.forEach((n,i)=>items.push([n+" reserved",colors[i%colors.length]]));
 if(D.budget)items.push(["budget "+fmtB(D.budget),"#c0392b"]);
 document.getElementById("legend").innerHTML=items.map(([n,c])=>'<span style="--c:'+c+'">'+n.replace(/&/g,"&amp;").replace(/</g,"&lt;")+"</span>").join("");
}
function esc(t){return String(t).replace(/&/g,"&amp;").replace(/</g,"&lt;").replace(/>/g,"&gt;")}
function show(s){
 chosen=s;draw();const tb=document.querySelector("#allocations tbody");if(!tb)return;
 if(!s){tb.innerHTML="";return}
 document.getElementById("moment").textContent="Live allocations "+(s.peak?"at the peak":"at "+(D.timed?fmtX(s.t/1e9):"event "+s.e));
 document.getElementById("moment-note").textContent=fmtB(s.live)+" live in "+s.n+" allocations after event "+s.e+(D.timed?" ("+fmtX(s.t/1e9)+")":"")+"; the largest "+s.top.length+", largest first.";
 tb.innerHTML=s.top.map((i,k)=>{const a=D.allocs[i];const age=D.timed?fmtX((s.t-a[4])/1e9):(s.e-a[3])+" events";
  const st=a[5]?D.stacks[a[5]-1]:null;const first=st?esc(st[0][0])+" ("+esc(st[0][1])+":"+st[0][2]+")":"";
  const all=st?'<details><summary>'+first+'</summary><div class="frames">'+st.map(f=>esc(f[0])+" "+esc(f[1])+":"+f[2]).join("<br>")+"</div></details>":"<span class=note>no stack recorded</span>";
  return "<tr><td>"+(k+1)+"</td><td>"+fmtB(a[0])+"</td><td>"+a[1]+"</td><td>"+a[2]+"</td><td>"+age+'</td><td class="l">'+all+"</td></tr>"}).join("");
}
function nearest(x){let best=null,d=Infinity;for(const s of D.samples){const e=Math.abs(sx(s)-x);if(e<d){d=e;best=s}}return best}
let drag=null,box=null;
function at(ev){const r=svg.getBoundingClientRect();return (ev.clientX-r.left)/r.width*W}
svg.addEventListener("mousedown",ev=>{drag=at(ev)});
svg.addEventListener("mousemove",ev=>{if(drag==null)return;const p=at(ev);if(box)box.remove();box=el("rect",{x:Math.min(drag,p),y:T,width:Math.abs(p-drag),height:H-T-B,fill:"rgba(41,128,185,.12)"})});
svg.addEventListener("mouseup",ev=>{const p=at(ev);if(box){box.remove();box=null}
 if(drag!=null&&Math.abs(p-drag)>5){const a=xOf(Math.min(drag,p)),b=xOf(Math.max(drag,p));x0=Math.max(lo,a);x1=Math.min(hi,b);if(x1<=x0)x1=x0+1e-9;draw()}
 else if(drag!=null){show(nearest(xOf(p)))} drag=null});
svg.addEventListener("wheel",ev=>{ev.preventDefault();const c=xOf(at(ev)),f=ev.deltaY>0?1.25:0.8;x0=Math.max(lo,c-(c-x0)*f);x1=Math.min(hi,c+(x1-c)*f);draw()},{passive:false});
document.getElementById("reset").addEventListener("click",()=>{x0=lo;x1=hi>lo?hi:lo+1;draw()});
legend();show(D.samples.find(s=>s.peak)||D.samples[D.samples.length-1]||null);draw();
"##;
