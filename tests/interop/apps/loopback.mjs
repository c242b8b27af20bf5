// Preloaded (`node --import ./loopback.mjs …`) into a server that binds every interface (the
// official example app servers listen on PORT at 0.0.0.0): its listen is bound to 127.0.0.1
// instead, so the tests serve on loopback only, without changing the server.
import net from 'node:net';

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function loopbackListen(...args) {
  const [first, ...rest] = args;
  if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
    if (typeof rest[0] === 'string') rest.shift();
    return listen.call(this, Number(first), '127.0.0.1', ...rest);
  }
  if (first && typeof first === 'object' && 'port' in first) {
    return listen.call(this, { ...first, host: '127.0.0.1' }, ...rest);
  }
  return listen.apply(this, args);
};
