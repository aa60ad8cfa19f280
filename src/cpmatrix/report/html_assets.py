"""The report page's stylesheet and script (:mod:`cpmatrix.report.html` inlines both:
the page is one self-contained file). The script shows a clicked cell's evidence in the
side panel and opens ``#cell=<id>`` links on that cell.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CSS", "JS"]

CSS: Final = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;
background:#f6f8fa}
header{background:#fff;border-bottom:1px solid #d0d7de;padding:14px 24px;position:sticky;top:0;
z-index:2}
h1{font-size:18px;margin:0 0 8px}
h2{font-size:15px;margin:0 0 10px}
main{padding:16px 24px;display:flex;flex-direction:column;gap:16px}
section{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:14px 16px}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}
#totals{display:flex;gap:8px;align-items:center;flex-wrap:wrap}
.count{font-weight:600;margin-right:4px}
.total{border:0;border-radius:12px;padding:3px 10px;font:600 13px system-ui,sans-serif;
cursor:pointer;background:var(--c);color:#fff}
.total[data-status=cached],.total[data-status=skipped]{color:#1f2328}
body[data-only] .total:not(.on){opacity:.45}
.mline{margin-left:8px;color:#2f9e44;font-weight:600;text-decoration:none}
.mline[data-killed=some]{color:#c92a2a}
h1 .src{font:400 12px ui-monospace,monospace;color:#57606a;margin-left:8px}
.failure{border-left:4px solid var(--c);margin:8px 0;padding:6px 10px;background:#fff8f8}
.failure[data-status=flaky]{background:#fff9ef}
.failure summary{cursor:pointer}
.badge{display:inline-block;min-width:58px;text-align:center;border-radius:4px;color:#fff;
background:var(--c);font:600 11px system-ui,sans-serif;text-transform:uppercase;padding:1px 6px}
.head{color:#57606a;margin:2px 0 0 66px;font-size:13px}
.ev{margin:6px 0 0 66px;font:12px ui-monospace,monospace;color:#0a3069}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:8px;overflow:auto;
max-height:340px;font:12px/1.35 ui-monospace,monospace;white-space:pre-wrap}
.ok{color:#2f9e44;margin:0}
.legend{display:flex;gap:12px;flex-wrap:wrap;align-items:center;margin:0 0 10px;
font-size:12px;color:#57606a}
.lg i{display:inline-block;width:11px;height:11px;border-radius:2px;background:var(--c);
margin-right:4px;vertical-align:-1px}
.lg i.ring{background:#fff;outline:2px solid #f08c00;outline-offset:-1px}
.hint{margin-left:auto}
table.grid{border-collapse:separate;border-spacing:0;width:100%}
.grid th,.grid td{border-bottom:1px solid #eaeef2;padding:6px 8px;vertical-align:top;
text-align:left}
.grid thead th{font:600 12px ui-monospace,monospace;color:#57606a;border-bottom:1px solid #d0d7de}
.grid tr.level th{background:#f6f8fa;font-size:11px;text-transform:uppercase;
letter-spacing:.06em;color:#57606a;padding:4px 8px}
.grid tr.target>th{width:230px;font-weight:500}
.tname{font:600 13px ui-monospace,monospace}
.plat{color:#57606a;font-weight:400}
.tmeta{display:flex;gap:4px;flex-wrap:wrap;margin-top:3px}
.tag{font-size:10px;background:#ddf4ff;color:#0969da;border-radius:8px;padding:0 6px}
.n{font-size:10px;border-radius:8px;padding:0 6px;color:#fff;background:var(--c)}
.n[data-status=cached],.n[data-status=skipped]{color:#1f2328}
td.empty{background:repeating-linear-gradient(45deg,#fff,#fff 4px,#f6f8fa 4px,#f6f8fa 8px)}
.dt{display:flex;align-items:center;gap:3px;flex-wrap:wrap;margin:1px 0}
.dtl{font:10px ui-monospace,monospace;color:#57606a;width:30px}
.sq{width:20px;height:20px;border:0;border-radius:3px;padding:0;background:var(--c);
color:rgba(255,255,255,.9);font:700 9px ui-monospace,monospace;cursor:pointer}
.sq[data-status=cached],.sq[data-status=skipped]{color:#1f2328}
.sq[data-mutants=survived]{outline:2px solid #f08c00;outline-offset:1px}
.sq[data-flipped]{box-shadow:inset 0 0 0 2px #fff;border:2px dashed #1f2328}
.lg i.flip{background:#fff;border:2px dashed #1f2328}
.sq:hover,.sq.sel{outline:2px solid #1f2328;outline-offset:1px}
#detail{position:fixed;right:16px;bottom:16px;width:min(560px,calc(100vw - 32px));
max-height:60vh;overflow:auto;z-index:3;border:1px solid #d0d7de;border-left:5px solid var(--c);
border-radius:8px;padding:10px 12px;background:#fff;box-shadow:0 8px 24px rgba(31,35,40,.2)}
#detail .x{position:sticky;top:0;float:right;border:0;background:none;font-size:18px;
cursor:pointer;color:#57606a}
#detail h3{margin:0 0 6px;font:600 13px ui-monospace,monospace;word-break:break-all}
#detail table{border-collapse:collapse;font:12px ui-monospace,monospace;width:100%;
table-layout:fixed}
#detail td{padding:1px 10px 1px 0;vertical-align:top;overflow-wrap:anywhere}
#detail td:first-child{width:42%;color:#57606a}
#detail .hl{color:#0a3069;margin:3px 0;font:12px ui-monospace,monospace}
table.mut{border-collapse:collapse;width:100%}
.mut td,.mut th{text-align:left;padding:3px 8px;border-bottom:1px solid #eaeef2;font-size:13px}
.mut tr[data-outcome=survived] td{background:#fff4e6}
.kills summary{cursor:pointer;color:#57606a;margin-top:8px}
.repro{margin-top:4px;font-size:12px;color:#57606a;user-select:all}
.repro code{background:#f6f8fa;padding:1px 4px;border-radius:4px}
.took{color:#57606a;font-size:12px}
table.times{border-collapse:collapse;margin:8px 0 16px;background:#fff}
table.times th,table.times td{border:1px solid #d0d7de;padding:3px 8px;text-align:left}
table.times td.num{text-align:right;font-variant-numeric:tabular-nums}
svg.hist{display:block}
"""

# Builds the click panel from the JSON block with textContent only (no HTML from data), and
# marks <html data-ready> so a headless browser test can tell the script ran.
JS: Final = """
(function(){
const cells=JSON.parse(document.getElementById('cpm-data').textContent);
const panel=document.getElementById('detail');
function el(tag,text,cls){const e=document.createElement(tag);
  if(text!==undefined)e.textContent=text;if(cls)e.className=cls;return e;}
function show(i){
  const c=cells[i];if(!c)return;
  document.querySelectorAll('.sq.sel').forEach(s=>s.classList.remove('sel'));
  const sq=document.querySelector('.sq[data-i="'+i+'"]');if(sq)sq.classList.add('sel');
  panel.replaceChildren();panel.dataset.status=c.status;panel.dataset.cell=c.id;
  const x=el('button','\u00d7','x');x.type='button';x.title='close';
  x.onclick=()=>{panel.hidden=true;history.replaceState(null,'',location.pathname);};
  panel.append(x,el('h3',c.status.toUpperCase()+'  '+c.id));
  if(c.headline)panel.append(el('div',c.headline,'hl'));
  c.highlights.forEach(h=>panel.append(el('div',h,'hl')));
  const t=el('table');
  const add=(k,v)=>{const r=t.insertRow();
    r.insertCell().textContent=k;r.insertCell().textContent=v;};
  ['mesh','world_size','dtype','autocast','path','params','tags','duration','attempts',
   'failing_ranks','message','digest','source.machine'].forEach(k=>{if(c.props[k])add(k,c.props[k]);});
  Object.entries(c.evidence).forEach(([k,v])=>add('evidence.'+k,v));
  c.mutants.forEach(([m,o,by])=>add('mutant '+m,o+(by?' by '+by:'')));
  panel.append(t);
  if(c.failed){const a=el('a','traceback \u2191');a.href='#f-'+c.id;
    a.onclick=()=>{document.getElementById('f-'+c.id).open=true;};panel.append(a);}
  panel.hidden=false;
}
document.addEventListener('click',e=>{
  const sq=e.target.closest('.sq');
  if(sq){const i=+sq.dataset.i;show(i);
    history.replaceState(null,'','#cell='+encodeURIComponent(cells[i].id));return;}
  const tot=e.target.closest('.total');
  if(tot){const s=tot.dataset.status,b=document.body;
    document.querySelectorAll('.total').forEach(x=>x.classList.remove('on'));
    if(b.dataset.only===s){delete b.dataset.only;}else{b.dataset.only=s;tot.classList.add('on');}}
});
const m=/^#cell=(.*)$/.exec(location.hash);
if(m){const id=decodeURIComponent(m[1]);const i=cells.findIndex(c=>c.id===id);
  if(i>=0){show(i);}}
document.documentElement.dataset.ready='1';
})();
"""
