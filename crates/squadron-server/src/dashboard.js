'use strict';
// The token lives in sessionStorage: it ends with the tab, is never sent by the browser on its
// own (unlike a cookie), and is read only by this page's origin.
const TOKEN_KEY='squadron.token';
// The WebSocket carries the token as a second offered subprotocol; the node answers with the
// first, which holds no secret.
const STREAM_PROTOCOL='squadron.v1';
const REFRESH_MS=2000;
// The task list: newest first, TASK_PAGE_MAX a page; `taskBefore` null is the newest page,
// else the id the page starts below. `taskOlder` is the cursor of the page after it.
const TASK_PAGE_MAX=50;
let taskBefore=null,taskOlder=null;
let timer=null,socket=null,detailId=null,projectSel=null,term=null,watching=0,watched=null;
// The terminal keeps this many lines; opening it reads the last SCROLLBACK_LINES of each
// file through the logs API, then the stream goes on from where that read ended.
const TERMINAL_LINES_MAX=10000,SCROLLBACK_LINES=2000;
// A task's states in the order a lifecycle meets them: the timeline lists those entered.
const TERMINAL=['COMPLETED','FAILED','FAILED_PRESERVED','CANCELLED'];
const BREAK_GLASS='break-glass access: ';
const $=id=>document.getElementById(id);
function esc(s){return String(s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]))}
function table(head,rows){return '<table><tr>'+head.map(h=>'<th>'+esc(h)+'</th>').join('')+'</tr>'+rows.map(r=>'<tr>'+r.map(c=>'<td>'+c+'</td>').join('')+'</tr>').join('')+'</table>'}
const cells=values=>values.map(v=>esc(v??''));
class ApiError extends Error{constructor(status,message){super(message);this.status=status}}
// Every call to the node: the tab's token, no cookies, no cache; a refusal becomes an ApiError
// with the node's message.
async function call(url,method='GET',body){
 const token=sessionStorage.getItem(TOKEN_KEY);
 if(!token)throw new ApiError(401,'signed out');
 const headers={'Authorization':'Bearer '+token};
 if(body!==undefined)headers['Content-Type']='application/json';
 const r=await fetch(url,{method,headers,body:body===undefined?undefined:JSON.stringify(body),cache:'no-store',credentials:'omit'});
 if(!r.ok){let m=r.status+' '+r.statusText;try{m=(await r.json()).message??m}catch(_){}throw new ApiError(r.status,m)}
 return r;
}
async function load(url){return (await call(url)).json()}
function signIn(message){
 clearInterval(timer);timer=null;closeStream();
 sessionStorage.removeItem(TOKEN_KEY);
 for(const id of ['cluster','tasks','projects'])$(id).textContent='loading…';
 projectSel=null;taskBefore=null;$('project').innerHTML='';$('project-error').textContent='';
 detailId=null;$('detail').innerHTML='<p>choose a task’s “details”.</p>';$('usage').textContent='';$('detail-error').textContent='';$('diff').hidden=true;$('diff').textContent='';
 watching++;watched=null;$('output-usage').textContent='';if(term)term.reset();$('terminal').hidden=true;$('output-head').textContent='choose a task’s or an agent’s “output”.';
 $('board').hidden=true;$('signout').hidden=true;$('signin').hidden=false;
 $('signin-error').textContent=message??'';
 $('token').value='';$('token').focus();
}
function showBoard(){
 $('signin').hidden=true;$('board').hidden=false;$('signout').hidden=false;
 refresh();clearInterval(timer);timer=setInterval(refresh,REFRESH_MS);
}
// 401: the token is gone or never was; back to the form with the node's words. Anything else
// (403 included) is shown where the data would be.
function failed(id,e){if(e.status===401){signIn(e.message)}else{$(id).innerHTML='<p class="err">'+esc(e.message)+'</p>'}}
async function section(id,url,render){try{const v=await load(url);if(!$('board').hidden)$(id).innerHTML=render(v)}catch(e){failed(id,e)}}
// The node's view: its role and term, how far it applied, its state's digest there (equal on
// every node at one index: INV-12), its snapshot, and each member's part.
function cluster(s){return '<p>node '+esc(s.node_id)+' is <b>'+esc(s.role)+'</b>, leader '+esc(s.leader??'none')+', term '+esc(s.term)+', applied '+esc(s.applied??'-')+
 ', digest <code class="digest" title="'+esc(s.digest)+'">'+esc(short(s.digest))+'</code>, snapshot '+esc(s.snapshot??'-')+'</p>'+
 table(['id','part','rest','grpc'],s.members.map(m=>cells([m.id,m.id===s.leader?'leader':m.voter?'voter':'learner',m.rest,m.grpc])))}
function taskUrl(){
 const state=$('task-state').value;
 return '/api/v1/tasks?consistency=stale&order=newest&limit='+TASK_PAGE_MAX+(state?'&state='+encodeURIComponent(state):'')+(taskBefore===null?'':'&before='+taskBefore);
}
// An answer to a page or filter the page has since left is dropped, not drawn.
function loadTasks(){const url=taskUrl();section('tasks',url,t=>url===taskUrl()?tasks(t):$('tasks').innerHTML)}
function tasks(t){
 taskOlder=t.next_before??null;$('tasks-older').disabled=taskOlder===null;$('tasks-newest').disabled=taskBefore===null;
 $('tasks-page').textContent=taskBefore===null?'newest first':'below task '+taskBefore;
 if(!t.tasks.length)return '<p>no tasks'+($('task-state').value?' in '+esc($('task-state').value):'')+'.</p>';
 return table(['id','name','state','attempt','worker','exit',''],t.tasks.map(x=>cells([x.id,x.spec.name,x.state,x.attempt,x.worker,x.exit_code]).concat(
 '<button type="button" data-detail="'+esc(x.id)+'">details</button>'+
 (x.worker?' <button type="button" data-watch="'+esc(x.id)+'">output</button>':''))))}
const when=ms=>new Date(ms).toISOString().replace('T',' ').replace('Z',' UTC');
// One task: its state timeline (every state it entered, when, and how long after submission),
// its error and break-glass line, its artifacts, and a cancel button while it has not ended.
function detail(t){
 const entered=Object.entries(t.entered_at_ms??{}).sort((a,b)=>a[1]-b[1]);
 const rows=[['SUBMITTED',t.submitted_at_ms]].concat(entered).map(([s,ms])=>cells([s,when(ms),((ms-t.submitted_at_ms)/1000).toFixed(1)+' s']));
 let html='<p>task <b>'+esc(t.id)+'</b> '+esc(t.spec.name)+': <b class="state">'+esc(t.state)+'</b>, attempt '+esc(t.attempt)+
  (TERMINAL.includes(t.state)?'':' <button type="button" data-cancel="'+esc(t.id)+'">cancel</button>')+'</p>'+
  '<div class="timeline">'+table(['state','entered','after'],rows)+'</div>';
 const error=t.error??'';const at=error.indexOf(BREAK_GLASS);
 if(error)html+='<p class="err">'+esc(at<0?error:error.slice(0,at))+'</p>';
 if(at>=0)html+='<p>break-glass: <code class="break-glass">'+esc(error.slice(at+BREAK_GLASS.length))+'</code></p>';
 if(t.artifacts?.length)html+='<div class="artifacts">'+table(['artifact',''],t.artifacts.map(a=>[esc(a),
  '<button type="button" data-download="'+esc(a)+'">download</button>'+(a.endsWith('.patch')?' <button type="button" data-diff="'+esc(a)+'">diff</button>':'')]))+'</div>';
 return html;
}
const artifactUrl=name=>'/api/v1/tasks/'+encodeURIComponent(detailId)+'/artifacts/'+name.split('/').map(encodeURIComponent).join('/');
async function fetchArtifact(name){return (await call(artifactUrl(name))).blob()}
async function download(name){
 try{const url=URL.createObjectURL(await fetchArtifact(name));const a=document.createElement('a');
  a.href=url;a.download=name.split('/').pop();document.body.append(a);a.click();a.remove();setTimeout(()=>URL.revokeObjectURL(url),10000)}
 catch(e){actionFailed(e)}
}
// A patch as a diff: added lines green, removed red, hunk heads blue; text only, never markup.
async function showDiff(name){
 const pre=$('diff');
 try{const text=await (await fetchArtifact(name)).text();pre.textContent='';
  for(const line of text.split('\n')){const s=document.createElement('span');s.textContent=line+'\n';
   if(line.startsWith('+')&&!line.startsWith('+++'))s.className='add';else if(line.startsWith('-')&&!line.startsWith('---'))s.className='del';else if(line.startsWith('@@'))s.className='hunk';
   pre.append(s)}
  pre.hidden=false}
 catch(e){actionFailed(e)}
}
async function cancel(id){
 $('detail-error').textContent='';
 if(!confirm('Cancel task '+id+'? A running task is asked to stop.'))return;
 try{await call('/api/v1/tasks/'+encodeURIComponent(id)+'?reason='+encodeURIComponent('cancelled from the dashboard'),'DELETE');refresh()}
 catch(e){actionFailed(e)}
}
// What an action (download, diff, cancel) met stays until the next action, beside the task.
function actionFailed(e){if(e.status===401){signIn(e.message)}else{$('detail-error').textContent=e.message}}
function showDetail(id){detailId=id;$('usage').textContent='';$('detail-error').textContent='';$('diff').hidden=true;$('diff').textContent='';$('detail').textContent='loading…';refresh()}
const MiB=b=>(b/1048576).toFixed(1)+' MiB';
// What the task's sandbox uses while an attempt lives: Docker and KVM sandboxes run an agent
// that reports it; the process runtime runs none, and its worker measures the attempt's
// cgroup leaf instead.
const AGENT_RUNTIMES=['docker','kvm'],LIVE_STATES=['READY','RUNNING','COMPLETING'];
const providerLine=p=>'; provider: '+p.tool_calls+' tool calls'+(p.current_tool?', current '+p.current_tool:'')+', tokens in/out '+p.input_tokens+'/'+p.output_tokens;
const usageLine=u=>'CPU '+(u.cpu_usec/1e6).toFixed(2)+' s, memory '+MiB(u.memory_bytes)+', disk '+MiB(u.disk_bytes);
// `id` as the page holds it (the button's text), which the answer's number would not equal.
// Each read has a number: a slow answer that comes after a later one's is dropped.
let usageReads=0,agentUsageReads=0;
async function showUsage(id,t){
 const me=++usageReads;let text;
 if(!LIVE_STATES.includes(t.state))text='sandbox usage: measured while an attempt runs';
 else if(!AGENT_RUNTIMES.includes(t.spec?.sandbox?.runtime))try{
  const m=await load('/api/v1/tasks/'+encodeURIComponent(id)+'/usage');
  text=m.usage?'sandbox: '+usageLine(m.usage)+' (attempt '+m.attempt+', measured by its worker)':'sandbox usage: attempt '+m.attempt+' has no sandbox now'}
 catch(e){if(e.status===401){signIn(e.message);return}text='sandbox usage: '+e.message}
 else try{const a=await load('/api/v1/tasks/'+encodeURIComponent(id)+'/agent?consistency=stale');const u=a.usage;
  const seen=Math.max(0,Math.round((Date.now()-a.last_seen_ms)/1000));
  text=u?'sandbox: '+usageLine(u)+' (agent of attempt '+a.attempt+', last check-in '+seen+' s ago)':'sandbox: its agent registered and has not reported usage yet'}
 catch(e){if(e.status===401){signIn(e.message);return}
  text=e.status===404?'sandbox usage: its agent has not registered yet':e.message}
 if(t.spec?.agent?.provider!=='script')try{const p=await load('/api/v1/tasks/'+encodeURIComponent(id)+'/provider?consistency=stale');if(p)text+=providerLine(p.progress)}catch(e){}
 if(detailId===id&&me===usageReads)$('usage').textContent=text;
}
function projects(p){return table(['tenant','project','profiles','slots','max','sandbox',''],p.map(x=>cells([x.tenant,x.project,x.profiles,x.slots_held,x.max_active,x.sandbox]).concat(
 '<button type="button" data-tenant="'+esc(x.tenant)+'" data-project="'+esc(x.project)+'">profiles</button>')))}
// The project's writer slots as a gauge: one box per slot, filled while a lease holds it.
const gauge=(held,max)=>'<span class="gauge" title="'+esc(held)+' of '+esc(max)+' slots held">'+'■'.repeat(Math.min(held,max))+'□'.repeat(Math.max(max-held,0))+'</span> '+esc(held)+'/'+esc(max);
const short=d=>d?String(d).slice(0,12)+'…':'-';
const leaseState=s=>typeof s==='string'?s:Object.keys(s??{})[0]??'-';
// A project: its slots, then each profile with its generation, its lease (state, holder,
// time left) and its capsule chain (newest first, each naming the digest it follows).
function project(p,profiles,leases){
 const byId=new Map(leases.map(l=>[l.id,l]));
 const now=Date.now();
 const rows=profiles.map(f=>{
  const l=f.live_lease!=null?byId.get(f.live_lease):null;
  const lease=l?'#'+l.id+' '+leaseState(l.state)+' by '+l.holder.worker+' ('+l.holder.process+'), '+Math.max(0,Math.round((l.expires_at_ms-now)/1000))+' s left':'-';
  const chain=[...(f.capsules??[])].reverse().map(c=>'#'+c.sequence+' '+short(c.digest)+(c.previous?' ← '+short(c.previous):'')).join('<br>');
  return cells([f.id,f.key,f.generation,lease]).concat(chain||'-',controls(f));
 });
 return '<h3>'+esc(p.tenant)+'/'+esc(p.project)+'</h3><p class="slots">slots '+gauge(p.slots_held,p.max_active)+'</p>'+
  table(['profile','key','generation','lease','capsules','agent'],rows);
}
// An agent's controls: launch while no lease is live, else take over (graceful or crash),
// stop, or watch its output. Each asks first; what the node refuses shows under the project.
const AGENT_ACTIONS={
 launch:{label:'launch',ask:k=>'Launch a provider for profile '+k+' under a new lease?',body:{}},
 graceful:{label:'take over',ask:k=>'Take over profile '+k+'? Its provider is asked to write a capsule and stop; the next generation starts from it.',path:'takeover',body:{kind:'graceful'}},
 crash:{label:'crash takeover',ask:k=>'Crash takeover of profile '+k+'? Its provider is killed, its lease fenced at expiry, and the next generation starts.',path:'takeover',body:{kind:'crash'}},
 stop:{label:'stop',ask:k=>'Stop profile '+k+'’s provider and end its lease?',body:{}},
};
function controls(f){
 const actions=f.live_lease!=null?['graceful','crash','stop']:['launch'];
 const output=f.live_lease!=null?' <button type="button" data-agent-output="'+esc(f.id)+'" data-key="'+esc(f.key)+'">output</button>':'';
 return actions.map(a=>'<button type="button" data-agent="'+esc(a)+'" data-profile="'+esc(f.id)+'" data-key="'+esc(f.key)+'">'+esc(AGENT_ACTIONS[a].label)+'</button>').join(' ')+output;
}
async function agentAction(action,profile,key){
 const a=AGENT_ACTIONS[action];$('project-error').textContent='';
 if(!a||!confirm(a.ask(key)))return;
 try{await call('/api/v1/profiles/'+encodeURIComponent(profile)+'/agent/'+(a.path??action),'POST',a.body);showProject()}
 catch(e){if(e.status===401){signIn(e.message)}else{$('project-error').textContent=key+': '+e.message}}
}
async function showProject(){
 if(!projectSel)return;
 const sel=projectSel,base='/api/v1/projects/'+encodeURIComponent(sel.tenant)+'/'+encodeURIComponent(sel.project);
 try{const [p,profiles,leases]=await Promise.all([load(base+'?consistency=stale'),load(base+'/profiles?consistency=stale'),load(base+'/leases?consistency=stale')]);
  if(projectSel===sel&&!$('board').hidden)$('project').innerHTML=project(p,profiles,leases)}
 catch(e){failed('project',e)}
}
function refresh(){
 section('cluster','/api/v1/cluster/status?consistency=stale',cluster);
 loadTasks();
 section('projects','/api/v1/projects?consistency=stale',projects);
 showProject();showAgentUsage();
 if(detailId!==null){const id=detailId;section('detail','/api/v1/tasks/'+encodeURIComponent(id)+'?consistency=stale',t=>{if(detailId!==id)return $('detail').innerHTML;showUsage(id,t);return detail(t)})}
}
// What the watched agent's generation uses (its worker measures the cgroup leaf it runs in).
async function showAgentUsage(){
 const t=watched;if(!t?.view)return;
 const me=++agentUsageReads;let text;
 try{const a=await load(t.view);text='generation '+a.generation+(a.usage?' uses '+usageLine(a.usage):': no usage measured now')}
 catch(e){if(e.status===401){signIn(e.message);return}text='usage: '+e.message}
 if(watched===t&&me===agentUsageReads)$('output-usage').textContent=text;
}
function closeStream(){if(socket){const s=socket;socket=null;s.close()}}
// One terminal for the page, made when first shown (xterm measures its box). Input is off:
// it shows a task's output, it is no shell. Output is the sandbox's, so it is written to the
// terminal as data, never to the page as markup.
function terminal(){
 $('terminal').hidden=false;
 if(!term){
  // Links in the output (OSC 8) are the sandbox's: activating one does nothing.
  term=new Terminal({convertEol:true,disableStdin:true,scrollback:TERMINAL_LINES_MAX,rows:24,fontSize:13,linkHandler:{activate:()=>{}}});
  const fit=new FitAddon.FitAddon();term.loadAddon(fit);term.open($('terminal'));fit.fit();
  addEventListener('resize',()=>fit.fit());
 }
 return term;
}
// stderr in red, as a terminal user expects it apart from stdout.
function show(stream,data){if(data)term.write(stream==='stderr'?'\x1b[31m'+data+'\x1b[0m':data)}
// What a terminal shows: a task's output, or a profile's current generation's.
const taskOutput=id=>({key:'task:'+id,label:'task '+id,logs:'/api/v1/tasks/'+encodeURIComponent(id)+'/logs',ws:'/ws/tasks/'+encodeURIComponent(id)+'/stream'});
const agentOutput=(id,key)=>({key:'profile:'+id,label:'profile '+key,view:'/api/v1/profiles/'+encodeURIComponent(id)+'/agent',logs:'/api/v1/profiles/'+encodeURIComponent(id)+'/agent/logs',ws:'/ws/profiles/'+encodeURIComponent(id)+'/agent/stream'});
// The last lines of each file through the logs API; where each read ended, for the stream.
// Output whose files do not exist yet has no scrollback: its stream starts at the beginning.
// An agent's read names its generation, so the stream goes on in the same one. A read that
// does not say where it ended (an older node) gives no scrollback: the stream has it all.
// `me` is this watch's number; a later watch makes it stale and it stops at once.
async function scrollback(target,me){
 const from={stdout:0,stderr:0,generation:null};
 for(const stream of ['stdout','stderr']){
  try{const r=await call(target.logs+'?stream='+stream+'&tail='+SCROLLBACK_LINES);
   const text=await r.text(),next=r.headers.get('x-squadron-next-offset');
   if(watching!==me)return null;
   if(next===null){term.reset();return {stdout:0,stderr:0,generation:null}}
   from.generation??=r.headers.get('x-squadron-generation');
   show(stream,text);from[stream]=Number(next)}
  catch(e){if(e.status===401)throw e;from[stream]=0}
 }
 return from;
}
async function watch(target){
 closeStream();const me=++watching;watched=target;$('output-usage').textContent='';showAgentUsage();
 const token=sessionStorage.getItem(TOKEN_KEY);
 if(!token){signIn('signed out');return}
 const head=$('output-head'),say=t=>{head.textContent=target.label+': '+t};
 terminal().reset();say('reading its output…');
 let from;
 try{from=await scrollback(target,me)}catch(e){signIn(e.message);return}
 if(from===null||watching!==me)return;
 say('connecting…');
 const ws=new WebSocket((location.protocol==='https:'?'wss://':'ws://')+location.host+target.ws+
  '?stdout_offset='+from.stdout+'&stderr_offset='+from.stderr+(from.generation===null?'':'&generation='+encodeURIComponent(from.generation)),
  [STREAM_PROTOCOL,'bearer.'+token]);
 let opened=false;socket=ws;
 ws.onopen=()=>{opened=true;say('live')};
 ws.onmessage=e=>{
  if(socket!==ws)return;
  let f;try{f=JSON.parse(e.data)}catch(_){return}
  if(f.type==='output')show(f.stream,String(f.data??''));
  else if(f.type==='task')say(f.task?.state??'ended');
  else if(f.type==='end'){say('ended');watched=null}
  else if(f.type==='error')say(f.message??'error');
 };
 // A refused handshake shows the browser no status: say what it usually means.
 ws.onclose=()=>{if(socket===ws){socket=null;if(!opened)say('the stream was refused (is the token still valid? has it started?)')}};
}
$('tasks').addEventListener('click',e=>{
 const w=e.target.closest('button[data-watch]');if(w)watch(taskOutput(w.dataset.watch));
 const d=e.target.closest('button[data-detail]');if(d)showDetail(d.dataset.detail);
});
$('project').addEventListener('click',e=>{
 const b=e.target.closest('button[data-agent]');if(b)agentAction(b.dataset.agent,b.dataset.profile,b.dataset.key);
 const o=e.target.closest('button[data-agent-output]');if(o)watch(agentOutput(o.dataset.agentOutput,o.dataset.key));
});
$('projects').addEventListener('click',e=>{
 const b=e.target.closest('button[data-project]');
 if(b){projectSel={tenant:b.dataset.tenant,project:b.dataset.project};$('project-error').textContent='';$('project').textContent='loading…';showProject()}
});
$('detail').addEventListener('click',e=>{
 const c=e.target.closest('button[data-cancel]');if(c)cancel(c.dataset.cancel);
 const g=e.target.closest('button[data-download]');if(g)download(g.dataset.download);
 const f=e.target.closest('button[data-diff]');if(f)showDiff(f.dataset.diff);
});
// A new filter or the newest page starts from the top; older goes one page down.
function showTasks(before){taskBefore=before;$('tasks').textContent='loading…';loadTasks()}
$('task-state').addEventListener('change',()=>showTasks(null));
$('tasks-newest').addEventListener('click',()=>showTasks(null));
$('tasks-older').addEventListener('click',()=>{if(taskOlder!==null)showTasks(taskOlder)});
$('signout').addEventListener('click',()=>signIn(''));
$('signin-form').addEventListener('submit',e=>{
 e.preventDefault();
 const token=$('token').value.trim();
 if(!/^[\x21-\x7e]+$/.test(token)){$('signin-error').textContent='a token is printable ASCII without spaces';return}
 sessionStorage.setItem(TOKEN_KEY,token);showBoard();
});
if(sessionStorage.getItem(TOKEN_KEY))showBoard();else signIn('');
