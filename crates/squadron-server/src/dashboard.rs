//! A small self-contained dashboard: cluster status and tasks, refreshed every two seconds.
//! Nothing is fetched from outside the node.

pub const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Squadron</title>
<style>
body{font-family:system-ui,sans-serif;margin:2rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}
th{background:#f3f3f3}.leader{font-weight:bold}.err{color:#b00}
</style></head><body>
<h1>Squadron</h1>
<h2>Cluster</h2><div id="cluster">loading…</div>
<h2>Tasks</h2><div id="tasks">loading…</div>
<h2>Projects</h2><div id="projects">loading…</div>
<script>
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]))}
function table(head,rows){return '<table><tr>'+head.map(h=>'<th>'+esc(h)+'</th>').join('')+'</tr>'+rows.map(r=>'<tr>'+r.map(c=>'<td>'+esc(c)+'</td>').join('')+'</tr>').join('')+'</table>'}
async function load(url){const r=await fetch(url);if(!r.ok)throw new Error((await r.json()).message);return r.json()}
async function refresh(){
 try{const s=await load('/api/v1/cluster/status?consistency=stale');
  document.getElementById('cluster').innerHTML='<p>node '+s.node_id+' is <b>'+esc(s.role)+'</b>, leader '+esc(s.leader??'none')+', term '+s.term+', applied '+esc(s.applied??'-')+'</p>'+
  table(['id','rest','grpc','voter'],s.members.map(m=>[m.id,m.rest,m.grpc,m.voter]))}catch(e){document.getElementById('cluster').innerHTML='<p class="err">'+esc(e.message)+'</p>'}
 try{const t=await load('/api/v1/tasks?consistency=stale&limit=50');
  document.getElementById('tasks').innerHTML=table(['id','name','state','attempt','worker','exit'],t.tasks.map(x=>[x.id,x.spec.name,x.state,x.attempt,x.worker??'',x.exit_code??'']))}catch(e){document.getElementById('tasks').innerHTML='<p class="err">'+esc(e.message)+'</p>'}
 try{const p=await load('/api/v1/projects?consistency=stale');
  document.getElementById('projects').innerHTML=table(['tenant','project','profiles','slots','max','sandbox'],p.map(x=>[x.tenant,x.project,x.profiles,x.slots_held,x.max_active,x.sandbox??'']))}catch(e){document.getElementById('projects').innerHTML='<p class="err">'+esc(e.message)+'</p>'}
}
refresh();setInterval(refresh,2000);
</script></body></html>
"#;
